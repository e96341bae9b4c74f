"""The README's commands work from a root shell without sudo and from a user shell with it:
scripts/as-root.sh (sourced by lab/*, scripts/test) runs a script again through sudo only
when a user started it, with the project's settings and the caller's arguments."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AS_ROOT = REPO / "scripts" / "as-root.sh"
RUNUSER = shutil.which("runuser") or shutil.which("setpriv")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory the unprivileged user can enter (pytest's own is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="gpuk8s-as-root-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "thing"
    script.parent.mkdir()
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f". {AS_ROOT}\nas_root \"$@\"\n"
        'echo "ran as $(id -u) with $* GPUK8S_X=${GPUK8S_X:-}"\n'
    )
    script.chmod(0o755)
    return script


def _fake_sudo(tmp_path: Path) -> tuple[Path, Path]:
    """(a directory holding a ``sudo`` that records its arguments, the record)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    record = tmp_path / "sudo.args"
    record.touch()
    record.chmod(0o666)
    (fake / "sudo").write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >{record}\n')
    (fake / "sudo").chmod(0o755)
    return fake, record


def _as_nobody(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    if os.getuid() != 0 or not RUNUSER:
        pytest.fail("this test runs as root (scripts/test does) and needs runuser (util-linux)")
    prefix = [RUNUSER, "-u", "nobody", "--"] if RUNUSER.endswith("runuser") else [
        RUNUSER, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    return subprocess.run(prefix + cmd, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=30)


def test_root_runs_directly_without_sudo(tmp_path: Path) -> None:
    script = _script(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "GPUK8S_X": "1"}   # no sudo on this PATH
    out = subprocess.run([str(script), "a", "b c"], env=env, capture_output=True, text=True,
                         check=True, timeout=30)
    assert out.stdout.strip() == f"ran as {os.getuid()} with a b c GPUK8S_X=1"


def test_user_reruns_through_sudo_with_settings_and_arguments(tmp_path: Path) -> None:
    script = _script(tmp_path)
    fake, record = _fake_sudo(tmp_path)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "GPUK8S_X": "two words", "UNRELATED": "no"}
    # started by a relative path from another directory: sudo gets the absolute one
    out = _as_nobody(["bin/thing", "a", "b c"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    args = record.read_text().splitlines()
    assert args[:2] == ["--", "env"]
    assert "GPUK8S_X=two words" in args
    # the caller's PATH, plus root's sbin directories a user's PATH on Debian lacks (lab/up
    # runs sysctl: "command not found" through a real sudo before they were added)
    assert f"PATH={fake}:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin" in args
    assert not any(a.startswith("UNRELATED=") for a in args)
    assert args[-3:] == [str(script), "a", "b c"]
    assert "ran as" not in out.stdout   # the user's own run stopped at the exec


def test_a_path_with_the_sbin_directories_is_kept_as_it_is(tmp_path: Path) -> None:
    script = _script(tmp_path)
    fake, record = _fake_sudo(tmp_path)
    path = f"/usr/sbin:{fake}:/usr/bin:/sbin:/bin:/usr/local/sbin"
    out = _as_nobody([str(script)], {"PATH": path}, tmp_path)
    assert out.returncode == 0, out.stderr
    assert [a for a in record.read_text().splitlines() if a.startswith("PATH=")] == [
        f"PATH={path}"]


def test_user_without_sudo_gets_a_clear_error(tmp_path: Path) -> None:
    script = _script(tmp_path)
    # a PATH with what the script needs and no sudo, whether this machine has one or not
    tools = tmp_path / "nosudo"
    tools.mkdir()
    for name in ("bash", "env", "id", "readlink"):
        found = shutil.which(name)
        assert found, name
        (tools / name).symlink_to(found)
    out = _as_nobody([str(script)], {"PATH": str(tools)}, tmp_path)
    assert out.returncode == 1
    assert "must run as root, and sudo is not installed" in out.stderr
    assert "ran as" not in out.stdout
