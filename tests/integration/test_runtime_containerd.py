"""container-runtime against the real containerd that reads each config shape (issue 28):
Debian's containerd 1.6 for config versions 1 and 2, containerd 2.x built from Go modules
(``lab/tools.sh containerd2``) for versions 3 and 4 (2.4's own) and the 1 and 2 it
migrates.

Each case starts a private containerd (its own root, state and sockets under a temp dir;
the lab's /run/containerd is never touched) under lab/supervise, as the lab and systemd
run it, with the original config; runs container-runtime's agent (restart mode signal)
on that node root; and checks what containerd itself says: the agent is ready only once
the restarted containerd (a new pid) serves the handler over its CRI, ``containerd -c FILE
config dump`` accepts the edited file and shows the handler, and uninstall restores the
file byte for byte and containerd stops serving the handler. Configs the agent cannot
edit safely, a containerd that ignores SIGHUP, and a containerd reading another file are
left as they were and reported failed.

Needs root; scripts/prereqs integration installs containerd 1.6 and builds 2.x.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from gpuk8s import sim
from gpuk8s.host.readiness import read_readiness
from gpuk8s.host.serving import peer_pid_or_zero
from gpuk8s.services.nodeagent import Reporter
from gpuk8s.services.runtime import agent as agent_module
from gpuk8s.services.runtime import containerd, proof
from gpuk8s.services.runtime.agent import WRAPPER_NAME, RuntimeAgent, RuntimeSettings
from tests.containerd_corpus import DROP_INS, Case, cases
from tests.fleet_dialects import lab_lib

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WRAPPER = f"/usr/local/gpuk8s/bin/{WRAPPER_NAME}"
DEBIAN = "/usr/bin/containerd"

CRI_V1 = """# no `version` key: containerd reads version 1
[plugins.cri]
  sandbox_image = "registry.k8s.io/pause:3.6"
  [plugins.cri.containerd]
    default_runtime_name = "runc"
    [plugins.cri.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.cri.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins.cri.cni]
    bin_dir = "/opt/cni/bin"
"""


def containerd2() -> str:
    pinned = (REPO / "lab/versions.env").read_text()
    version = pinned.split("CONTAINERD2_VERSION=", 1)[1].split()[0]
    directory = subprocess.run([str(REPO / "lab/tools.sh"), "containerd2"], check=True,
                               capture_output=True, text=True, timeout=3600).stdout.strip()
    binary = os.path.join(directory, "containerd")
    assert version in subprocess.run([binary, "--version"], capture_output=True, text=True,
                                     check=True).stdout
    return binary


LAB_SOCKETS = ("/run/containerd/containerd.sock", "/run/containerd/containerd.sock.ttrpc")


def lab_config(version: int | None) -> str:
    """The lab's own containerd config (lab/lib.sh ``containerd_config``: version 2 for
    containerd 1.6, version 3 for 2.x) made a private node's (``node_private``): ``version``
    2 or 3 as the lab writes it, 4 the version-3 one as containerd 2.4 writes its own
    (version 4: the server addresses in plugins), None the version-2 one without its
    ``version`` key (containerd reads it as version 1)."""
    doc = tomlkit.parse(lab_lib('containerd_config "$1"', "2" if version in (3, 4) else "1.6"))
    assert doc["version"] == (3 if version in (3, 4) else 2), doc["version"]
    if version is None:
        del doc["version"]
    elif version == 4:
        doc["version"] = 4
        for name in ("grpc", "ttrpc"):  # version 4 has them in plugins (node_private)
            del doc[name]
    return node_private(tomlkit.dumps(doc), version or 1)


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does


def _default_sighup() -> None:
    # an ignored signal stays ignored across exec: under `nohup scripts/test` a containerd
    # meant to take SIGHUP would inherit it ignored unless it is reset
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.1)
    return value


@dataclass
class Node:
    """A node root (``base``) with a private containerd serving its socket."""

    base: Path
    binary: str
    procs: list[subprocess.Popen[bytes]]

    @property
    def config(self) -> Path:
        return self.base / "etc/containerd/config.toml"

    @property
    def socket(self) -> str:
        return str(self.base / "run/containerd/containerd.sock")

    def pid(self) -> int:
        return peer_pid_or_zero(self.socket)

    def start(self, supervised: bool = True, ignore_sighup: bool = False,
              config: Path | None = None) -> int:
        dump = subprocess.run([self.binary, "-c", str(config or self.config), "config", "dump"],
                              capture_output=True, text=True, timeout=60, check=True).stdout
        for lab in LAB_SOCKETS:  # never start one that would take the lab's sockets
            assert f"'{lab}'" not in dump and f'"{lab}"' not in dump, dump
        assert str(self.base / "run/containerd/containerd.sock") in dump, dump
        argv = [self.binary, "--config", str(config or self.config)]
        if supervised:
            argv = [str(REPO / "lab/supervise"), *argv]
        log = (self.base / "containerd.log").open("ab")
        sighup = _ignore_sighup if ignore_sighup else _default_sighup
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=log, preexec_fn=sighup))
        return int(wait_for("containerd serving its CRI", self.serving))

    def serving(self) -> int:
        try:
            containerd.cri_config(self.socket, timeout=2)
        except containerd.RuntimeConfigError:
            return 0
        return self.pid()

    def served(self) -> dict[str, Any]:
        return containerd.cri_config(self.socket)

    def dump(self) -> subprocess.CompletedProcess[str]:
        """``containerd -c FILE config dump``: containerd's own reading of the file."""
        return subprocess.run([self.binary, "-c", str(self.config), "config", "dump"],
                              capture_output=True, text=True, timeout=60, check=False)

    def agent(self, tmp_path: Path, **settings: Any) -> RuntimeAgent:
        gpu_root = tmp_path / "gpu"
        if not gpu_root.exists():
            sim.create(str(gpu_root), "c500-8", device_nodes="char")
        values = {"runtime": "containerd", "runtime_version": "", "restart_mode": "signal",
                  "device_path_prefix": str(gpu_root), **settings}
        return RuntimeAgent(RuntimeSettings(host_root=str(gpu_root), system_root=str(self.base),
                                            **values),
                            Reporter(None, "container-runtime", "Runtime"))


@pytest.fixture
def node() -> Iterator[Callable[[str, str], Node]]:
    if os.geteuid() != 0:
        pytest.fail("containerd needs root (scripts/test runs the tiers as root)")
    made: list[Node] = []

    def make(binary: str, text: str) -> Node:
        assert os.path.exists(binary), f"{binary}: scripts/prereqs integration installs it"
        base = Path(tempfile.mkdtemp(prefix="ctd", dir="/tmp"))  # short: unix socket paths
        for directory in ("etc/containerd", "usr/bin", "run/containerd"):
            (base / directory).mkdir(parents=True)
        (base / "usr/bin/python3").symlink_to(sys.executable)
        fresh = Node(base, binary, [])
        fresh.config.write_text(text.replace("@BASE@", str(base)))
        made.append(fresh)
        return fresh

    yield make
    for each in made:
        for proc in reversed(each.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        subprocess.run(["umount", "-R", str(each.base / "run/containerd/state")],
                       capture_output=True, check=False)
        shutil.rmtree(each.base, ignore_errors=True)


def _cri_table(dump: str) -> Any:
    """The CRI runtime section of a ``config dump`` (1.6: version 2; 2.x: version 4)."""
    plugins = tomlkit.parse(dump)["plugins"]
    section = plugins.get("io.containerd.cri.v1.runtime") or plugins["io.containerd.grpc.v1.cri"]
    return section["containerd"]


CASES = [  # (containerd, config version, a version-1 config's CRI section; None: the lab's)
    ("1.6", None, CRI_V1),
    ("1.6", None, ""),  # version 1 without any CRI section: containerd's defaults
    ("1.6", 2, None),
    ("2.x", 2, None),  # migrated by 2.x
    ("2.x", 3, None),
    ("2.x", 4, None),  # what 2.4 writes (`containerd config default`)
    ("2.x", None, CRI_V1),  # 2.x still migrates version 1
]


@pytest.mark.parametrize(("generation", "version", "cri"), CASES)
def test_real_containerd_serves_the_edited_config_and_uninstall_restores_it(
    node: Callable[[str, str], Node], tmp_path: Path, generation: str, version: int | None,
    cri: str | None,
) -> None:
    binary = DEBIAN if generation == "1.6" else containerd2()
    n = node(binary, lab_config(version) if cri is None else node_private(cri, 1))
    original = n.config.read_bytes()
    before = n.start()
    assert containerd.not_served(n.served(), "metax", WRAPPER, True)  # not there yet
    agent = n.agent(tmp_path)
    assert agent.mode() == "wrapper"
    report = agent.one_pass()
    assert report.state == "ready", report.message
    # proven first by a private containerd of the same binary
    assert report.details["proof"].startswith("proven with a private containerd "), report
    after = n.pid()
    assert after not in (0, before)  # really restarted: a new containerd serves the socket
    assert containerd.not_served(n.served(), "metax", WRAPPER, True) is None
    assert read_readiness(agent.settings.host_root) == {"runtime.ready": True}
    edited = n.config.read_text()
    assert ("version" in tomlkit.parse(edited)) == (version is not None)  # its own shape
    dump = n.dump()
    assert dump.returncode == 0, dump.stderr
    section = _cri_table(dump.stdout)
    assert section["default_runtime_name"] == "metax"
    assert section["runtimes"]["metax"]["options"]["BinaryName"] == WRAPPER
    assert "cdi.k8s.io/*" in section["runtimes"]["metax"]["container_annotations"]
    assert agent.one_pass().state == "ready" and n.pid() == after  # no second restart
    done = agent.uninstall()
    assert n.config.read_bytes() == original, done  # byte for byte
    assert n.pid() not in (0, after)
    assert containerd.not_served(n.served(), "metax", None, True) is None  # gone
    assert not (n.base / "usr/local/gpuk8s").exists()


def test_a_containerd_that_ignores_sighup_is_reported_and_its_config_left_alone(
    node: Callable[[str, str], Node], tmp_path: Path,
) -> None:
    """Issue 28 item 0 with the real containerd 1.6, started as the lab's first lab/up
    started it from a SIGHUP-ignoring parent (no supervisor that resets it)."""
    n = node(DEBIAN, lab_config(2))
    original = n.config.read_bytes()
    pid = n.start(supervised=False, ignore_sighup=True)
    agent = n.agent(tmp_path)
    for _ in range(2):
        report = agent.one_pass()
        assert report.state == "failed", report.message
        assert f"containerd (pid {pid}) ignores SIGHUP" in report.message
        assert read_readiness(agent.settings.host_root) == {"runtime.ready": False}
        assert n.config.read_bytes() == original
        assert n.pid() == pid
    os.kill(pid, signal.SIGHUP)  # proof: the real containerd does ignore it
    time.sleep(1)
    assert n.pid() == pid
    # the same containerd under lab/supervise from the same parent: it restarts
    n.procs[-1].terminate()
    n.procs[-1].wait()
    first = n.start(supervised=True, ignore_sighup=True)
    report = agent.one_pass()
    assert report.state == "ready", report.message
    assert n.pid() not in (0, first)


def test_an_unsafe_config_is_left_untouched_and_containerd_not_restarted(
    node: Callable[[str, str], Node], tmp_path: Path,
) -> None:
    """No `version` key (so version 1) but a CRI section named by URI: containerd 1.6 runs
    on it (ignoring that section); the agent refuses to guess."""
    n = node(DEBIAN, lab_config(None))
    original = n.config.read_bytes()
    pid = n.start()
    report = n.agent(tmp_path).one_pass()
    assert report.state == "failed" and "reads it as version 1" in report.message, report.message
    assert n.config.read_bytes() == original
    assert sorted(p.name for p in n.config.parent.iterdir()) == ["config.toml"]
    assert n.pid() == pid  # not restarted


def test_restart_mode_none_before_containerd_runs_is_pending_then_served_when_it_starts(
    node: Callable[[str, str], Node], tmp_path: Path,
) -> None:
    """A node provisioned before its runtime starts (restart mode none): the edit is made and
    said as pending, not failed; the real containerd started afterwards serves it."""
    n = node(DEBIAN, lab_config(2))
    agent = n.agent(tmp_path, restart_mode="none")
    report = agent.one_pass()
    assert report.state == "pending", report.message
    assert "containerd is not running" in report.message, report.message
    assert 'default_runtime_name = "metax"' in n.config.read_text()
    n.start()
    assert containerd.not_served(n.served(), "metax", WRAPPER, True) is None
    assert agent.one_pass().state == "ready"


def test_a_containerd_reading_another_file_is_restarted_once_then_the_edit_undone(
    node: Callable[[str, str], Node], tmp_path: Path,
) -> None:
    n = node(DEBIAN, lab_config(2))
    original = n.config.read_bytes()
    other = n.base / "etc/containerd/other.toml"
    other.write_bytes(original)
    n.start(config=other)  # the chart's runtime.containerd.config names the wrong file
    agent = n.agent(tmp_path)
    report = agent.one_pass()
    assert report.state == "failed", report.message
    assert "does not serve runtime handler 'metax'" in report.message
    assert "does it read /etc/containerd/config.toml?" in report.message
    assert n.config.read_bytes() == original  # put back
    restarted = n.pid()
    assert restarted and n.serving()
    report = agent.one_pass()  # the same containerd, the same config: not restarted again
    assert report.state == "failed" and "not tried again" in report.message
    assert n.pid() == restarted and n.config.read_bytes() == original


def test_native_cdi_on_containerd_2_is_read_from_its_cri(
    node: Callable[[str, str], Node], tmp_path: Path,
) -> None:
    n = node(containerd2(), lab_config(3))
    original = n.config.read_bytes()
    pid = n.start()
    version = subprocess.run([n.binary, "--version"], capture_output=True, text=True,
                             check=True).stdout.split()[2]
    agent = n.agent(tmp_path, runtime="auto", runtime_version=f"containerd://{version}")
    assert agent.mode() == "native"
    report = agent.one_pass()
    assert report.state == "ready", report.message
    assert n.config.read_bytes() == original and n.pid() == pid  # nothing to edit
    assert containerd.cri_cdi_enabled(n.served())
    # containerd 1.6 has no CDI: told it is 2.x (a wrong Node status), the agent says so
    old = node(DEBIAN, lab_config(2))
    old.start()
    agent = old.agent(tmp_path, runtime="auto", runtime_version="containerd://2.0.0")
    report = agent.one_pass()
    assert report.state == "failed" and "CDI off" in report.message


# ------------------------------------------------------------------------------ the corpus
def node_private(text: str, version: int) -> str:
    """A corpus config made a private node's: its root, state, sockets, ``opt`` directory
    and stream port moved under @BASE@ (tomlkit, in place: the runtimes' shape, dotted keys
    and inline tables stay as written) and its /etc/containerd paths under @BASE@."""
    for quote in "\"'":  # basic and literal strings (containerd 2.x writes the latter)
        text = text.replace(f"{quote}{DROP_INS}/", f"{quote}conf.d/")  # relative: the node's
        text = text.replace(f"{quote}/etc/containerd/", f"{quote}@BASE@/etc/containerd/")
    doc = tomlkit.parse(text)
    doc["root"] = "@BASE@/var/lib/containerd"
    doc["state"] = "@BASE@/run/containerd/state"
    sock = "@BASE@/run/containerd/containerd.sock"
    plugins = doc.setdefault("plugins", tomlkit.table(is_super_table=True))
    for name, address in (("grpc", sock), ("ttrpc", sock + ".ttrpc"), ("debug", ""),
                          ("metrics", "")):
        table = plugins.setdefault(f"io.containerd.server.v1.{name}", tomlkit.table()) \
            if version == 4 else doc.setdefault(name, tomlkit.table())
        table["address"] = address
    opt = plugins.setdefault("opt" if version == 1 else "io.containerd.internal.v1.opt",
                             tomlkit.table())
    opt["path"] = "@BASE@/opt/containerd"
    cri = plugins.get("cri" if version == 1 else "io.containerd.grpc.v1.cri")
    if cri is not None and "stream_server_port" in cri:
        cri["stream_server_port"] = "0"
    return tomlkit.dumps(doc)


@pytest.mark.parametrize("case", [c for c in cases() if c.refusal is None and c.text],
                         ids=lambda c: c.name)
def test_each_edited_corpus_config_is_served_by_the_real_containerd_of_its_generation(
    node: Callable[[str, str], Node], tmp_path: Path, case: Case,
) -> None:
    """The agent's edit of every corpus shape, proven by a private containerd first, then
    judged by the node's containerd itself after the restart: the CRI plugin loaded (`ctr
    plugins ls`: `ok`, not only `config dump` exiting 0) and the handler served; uninstall
    gives the file back byte for byte and containerd runs it without the handler."""
    version = int(tomlkit.parse(case.text).get("version", 1))
    text = node_private(case.text, version)
    for line in case.text.splitlines():  # the construct under test is still there
        if "runtimes" in line or "runc" in line:
            assert line.replace('"/etc/containerd/', '"@BASE@/etc/containerd/') in text, line
    n = node(DEBIAN if case.generation == "1.6" else containerd2(), text)
    (n.base / "etc/containerd/cri-base.json").write_text('{"ociVersion": "1.1.0"}\n')
    for path, drop_in in case.drop_ins.items():
        (n.base / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (n.base / path.lstrip("/")).write_text(drop_in.replace(
            '"/etc/containerd/', f'"{n.base}/etc/containerd/'))
    original = n.config.read_bytes()
    before = n.start()
    assert cri_loaded(n) == "ok"
    agent = n.agent(tmp_path)
    report = agent.one_pass()
    assert report.state == "ready", report.message
    assert report.details["proof"].startswith("proven with a private containerd "), report
    assert n.pid() not in (0, before)
    assert cri_loaded(n) == "ok"
    assert containerd.not_served(n.served(), "metax", WRAPPER, True) is None
    runc = n.served()["containerd"]["runtimes"]["runc"]
    assert runc["options"].get("BinaryName", "") != WRAPPER  # runc's options stay runc's
    ours = n.base / "etc/containerd/conf.d/zz-gpuk8s-metax.toml"
    assert ours.exists() == case.drop_in
    if case.drop_in:
        assert n.config.read_bytes() == original  # the handler is in our drop-in
    done = agent.uninstall()
    assert n.config.read_bytes() == original, done
    assert not ours.exists()
    assert cri_loaded(n) == "ok"
    assert containerd.not_served(n.served(), "metax", None, True) is None


def cri_loaded(n: Node) -> str:
    """The CRI plugin's status in ``ctr plugins ls`` of the node's containerd."""
    ctr = os.path.join(os.path.dirname(n.binary), "ctr")
    listed = subprocess.run([ctr, "--address", n.socket, "plugins", "ls"], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    rows = [line.split() for line in listed.splitlines()]
    status = [row[-1] for row in rows
              if len(row) >= 3 and row[0] == "io.containerd.grpc.v1" and row[1] == "cri"]
    return status[0] if status else "absent"


def _issue_49_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The edit issue 49 saw on a dotted-key config: the handler at top level, the default
    runtime pointing at it; containerd's CRI plugin then fails to load ("no corresponding
    runtime") while `config dump` exits 0."""
    def broken(text: str, handler: str, binary: str, set_default: bool,
               imported: Any = None) -> containerd.Configured:
        bad = text.replace('default_runtime_name = "runc"', f'default_runtime_name = "{handler}"')
        bad += f'\n[runtimes.{handler}]\n  runtime_type = "io.containerd.runc.v2"\n'
        return containerd.Configured(bad, True, "runc", None, 2)

    monkeypatch.setattr(containerd, "configure", broken)


def test_an_edit_the_private_containerd_refuses_never_reaches_the_node(
    node: Callable[[str, str], Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = node(DEBIAN, lab_config(2))
    original = n.config.read_bytes()
    pid = n.start()
    _issue_49_edit(monkeypatch)
    agent = n.agent(tmp_path)
    report = agent.one_pass()
    assert report.state == "failed", report.message
    assert "not changed: a private containerd 1.6" in report.message, report.message
    assert n.config.read_bytes() == original and n.pid() == pid  # never restarted
    assert cri_loaded(n) == "ok"
    assert not (n.base / "usr/local/gpuk8s/proof").exists()  # the private one cleaned up
    report = agent.one_pass()
    assert report.state == "failed" and "not tried again" in report.message


def test_a_restart_that_loses_the_cri_restores_the_config_restarts_and_says_why(
    node: Callable[[str, str], Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 49 item 1 where no private containerd can prove the edit (skipped): after the
    restart the CRI is gone, so the original goes back, containerd is restarted onto it and
    its CRI must answer again before the pass reports failed."""
    n = node(DEBIAN, lab_config(2))
    original = n.config.read_bytes()
    first = n.start()
    _issue_49_edit(monkeypatch)
    monkeypatch.setattr(proof, "prove", lambda *a, **k: proof.Proof(skipped="test"))
    monkeypatch.setattr(agent_module, "RESTART_TIMEOUT", 15.0)
    agent = n.agent(tmp_path)
    report = agent.one_pass()
    assert report.state == "failed", report.message
    assert "is as it was and containerd was restarted onto it" in report.message, report.message
    assert n.config.read_bytes() == original
    assert n.pid() not in (0, first)
    assert cri_loaded(n) == "ok"  # the node has its CRI back
    assert containerd.not_served(n.served(), "metax", None, True) is None


def test_a_proof_that_cannot_run_here_is_skipped_and_said(
    node: Callable[[str, str], Node], tmp_path: Path,
) -> None:
    """Where the private containerd's directory cannot be made (a read-only host mount in the
    pod), or the original itself does not run privately, the edit is not proven and says so;
    the original must be the control: a private containerd refusing both blames neither."""
    n = node(DEBIAN, lab_config(2))
    n.start()
    text = n.config.read_text()
    args = ("/etc/containerd", lambda p: str(n.base) + p, "metax", WRAPPER, True)
    unwritable = proof.prove(n.socket, text, text, *args, work_dir="/dev/null/proof")
    assert unwritable.failed is None and "Not a directory" in str(unwritable.skipped)
    broken = text.replace('default_runtime_name = "runc"', 'default_runtime_name = "none"')
    both = proof.prove(n.socket, broken, broken, *args,
                       work_dir=str(n.base / "usr/local/gpuk8s/proof"))
    assert both.failed is None and "does not run the unedited config either" in str(
        both.skipped), both
    assert proof.prove(n.socket, text, broken, *args,
                       work_dir=str(n.base / "usr/local/gpuk8s/proof")).failed
