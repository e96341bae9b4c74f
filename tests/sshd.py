"""A private Debian sshd and a non-root user with real sudo, for Ansible over SSH in tests.

``private_sshd()`` starts ``/usr/sbin/sshd`` on 127.0.0.1 on a free port with its own host
key, config and pid file in a temp dir (never the host's /etc/ssh/sshd_config), and a
user (``USER``, created when missing, with a locked-out password and a shell) who logs
in with a key only and runs ``sudo`` without a password (a file in /etc/sudoers.d,
checked with ``visudo -c``). ``Sshd.inventory()`` writes an inventory that reaches it the
way an administrator's does: ``ansible_connection: ssh``, that user and key, become
through sudo in the playbooks, and interpreter discovery (no
``ansible_python_interpreter``). On exit sshd is stopped, the temp dir removed, and the
user and the sudoers file removed again when this run created them.

Needs root, ``/usr/sbin/sshd`` and ``/usr/bin/sudo`` (Debian's openssh-server and sudo;
``scripts/prereqs integration`` installs them); ``missing()`` names what is not there.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SSHD = "/usr/sbin/sshd"
SUDO = "/usr/bin/sudo"
USER = "gpuk8s-ssh-test"
SUDOERS = Path("/etc/sudoers.d") / USER


def missing() -> str | None:
    """What this machine lacks for a private sshd, or None."""
    for program in (SSHD, SUDO, "/usr/bin/ssh", "/usr/bin/ssh-keygen", "/usr/sbin/visudo"):
        if not os.access(program, os.X_OK):
            return (f"{program} not installed "
                    "(scripts/prereqs integration installs openssh-server and sudo)")
    if os.geteuid() != 0:
        return "a private sshd and a test user need root"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Sshd:
    base: Path
    port: int
    user: str
    key: Path  # the user's private key

    def inventory(self, groups: Sequence[str], host: str = "node1",
                  host_vars: Mapping[str, Any] | None = None) -> Path:
        """An inventory (JSON is YAML) with ``host`` in every group of ``groups``."""
        hostvars = {
            "ansible_host": "127.0.0.1",
            "ansible_port": self.port,
            "ansible_connection": "ssh",
            "ansible_user": self.user,
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args":
                "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no",
            **(host_vars or {}),
        }
        inv = {"all": {"hosts": {host: hostvars},
                       "children": {group: {"hosts": {host: {}}} for group in groups}}}
        path = self.base / f"inventory-{host}.yml"
        path.write_text(json.dumps(inv, indent=2) + "\n")
        return path

    def ssh(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``command`` as the user over this sshd."""
        return subprocess.run(
            ["ssh", "-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no",
             "-o", "LogLevel=ERROR", f"{self.user}@127.0.0.1", command],
            capture_output=True, text=True, timeout=timeout, check=False)


def _ensure_user(user: str) -> bool:
    """Create ``user`` (home, bash, no usable password) when missing; True if created."""
    try:
        pwd.getpwnam(user)
        return False
    except KeyError:
        pass
    # '*': no password login, yet not "locked" ('!'), which sshd refuses without PAM
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--password", "*", user],
                   check=True, capture_output=True)
    return True


@contextlib.contextmanager
def private_sshd(user: str = USER) -> Iterator[Sshd]:
    why = missing()
    if why:
        raise RuntimeError(why)
    base = Path(tempfile.mkdtemp(prefix="gpuk8s-sshd-"))
    os.chmod(base, 0o755)  # the user's sshd session reads authorized_keys in it
    created_user = _ensure_user(user)
    made_sudoers = not SUDOERS.exists() if user == USER else False
    proc: subprocess.Popen[bytes] | None = None
    try:
        for key in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / key)],
                           check=True)
        keys = base / "authorized_keys"
        shutil.copy(base / "user_key.pub", keys)
        os.chmod(keys, 0o644)
        if user == USER:
            rule = base / "sudoers"
            rule.write_text(f"{user} ALL=(ALL:ALL) NOPASSWD: ALL\n")
            subprocess.run(["visudo", "-c", "-q", "-f", str(rule)], check=True)
            os.chmod(rule, 0o440)
            shutil.move(str(rule), SUDOERS)
        port = _free_port()
        (base / "sshd_config").write_text(
            f"ListenAddress 127.0.0.1:{port}\n"
            f"HostKey {base}/host_key\n"
            f"PidFile {base}/sshd.pid\n"
            f"AuthorizedKeysFile {keys}\n"
            f"AllowUsers {user}\n"
            # the key file lies under /tmp (world-writable), which StrictModes refuses
            "StrictModes no\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin no\nUsePAM no\n"
            "Subsystem sftp internal-sftp\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        log = (base / "sshd.log").open("wb")
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(base / "sshd_config")],
                                stdout=log, stderr=log)
        server = Sshd(base, port, user, base / "user_key")
        deadline = time.monotonic() + 30
        while server.ssh("true", timeout=10).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("private sshd did not answer: "
                                   + (base / "sshd.log").read_text()[-2000:])
            time.sleep(0.2)
        yield server
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
        if made_sudoers:
            with contextlib.suppress(OSError):
                SUDOERS.unlink()
        if created_user:
            subprocess.run(["userdel", "--remove", user], check=False, capture_output=True)
