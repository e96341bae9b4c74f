"""lab/lablock.py: one lock file for every user of the lab (the e2e tier, the benchmarks,
a shell), held with flock(2). The other holder or taker in these tests is always a second
process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "lab"
sys.path.insert(0, str(LAB))
import lablock  # noqa: E402  (lab/lablock.py)

sys.path.remove(str(LAB))

HOLDER = """
import fcntl, sys, time
handle = open(sys.argv[1], "a+")
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


def held_elsewhere(path: Path) -> subprocess.Popen[str]:
    """A second process holding the lock until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


# exits 1 where the lock is taken (a non-blocking try), 0 where it could take it
PROBE = """
import fcntl, sys
handle = open(sys.argv[1], "a+")
try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(1)
"""


def locked(path: Path) -> bool:
    """Whether another process cannot take the lock now."""
    return subprocess.run([sys.executable, "-c", PROBE, str(path)], check=False).returncode == 1


def test_the_lock_is_the_e2e_lock_of_the_lab_state_directory() -> None:
    assert lablock.lock_path({}) == Path("/var/lib/gpuk8s-lab/e2e.lock")
    assert lablock.lock_path({"GPUK8S_LAB_STATE": "/srv/lab"}) == Path("/srv/lab/e2e.lock")
    # the e2e tier takes the helper's file (one path for every lab user)
    conftest = (REPO / "tests" / "e2e" / "conftest.py").read_text()
    assert "lablock.hold(" in conftest and '"e2e.lock"' not in conftest


def test_hold_excludes_other_processes_and_releases_after_the_block(tmp_path: Path) -> None:
    path = tmp_path / "e2e.lock"
    said: list[str] = []
    with lablock.hold(path, said.append) as where:
        assert where == path
        assert locked(path)
    assert not locked(path)
    assert said == []  # free: taken at once, nothing announced


def test_hold_waits_for_another_holder_and_says_so_once(tmp_path: Path) -> None:
    path = tmp_path / "e2e.lock"
    other = held_elsewhere(path)
    said: list[str] = []
    released: list[float] = []

    def announce(line: str) -> None:
        said.append(line)
        time.sleep(0.3)  # the holder lets go only after the waiter announced itself
        released.append(time.monotonic())
        assert other.stdin is not None
        other.stdin.close()

    with lablock.hold(path, announce):
        # inside the block only once the other process had let go
        assert other.wait(10) == 0
        assert released
    assert said == [f"another lab session holds {path}: waiting"]


def test_hold_releases_when_the_block_raises(tmp_path: Path) -> None:
    path = tmp_path / "e2e.lock"
    with pytest.raises(RuntimeError), lablock.hold(path, print):
        raise RuntimeError("boom")
    assert not locked(path)


def test_command_line_runs_the_command_under_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "e2e.lock"
    proc = subprocess.run([sys.executable, str(LAB / "lablock.py"), sys.executable, "-c", PROBE,
                           str(path)], env={"GPUK8S_LAB_STATE": str(tmp_path)}, check=False)
    assert proc.returncode == 1  # the command found the lock taken (by its parent)
    assert not locked(path)
