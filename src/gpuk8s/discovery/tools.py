"""Running vendor tools (mx-smi, nvidia-smi) found under a host root.

A *runner* is any callable taking an argv list and returning ``(rc, stdout, stderr)``.
Tests pass their own; the default runs the program with a timeout. Runner failures
(timeouts, missing programs, exceptions from a custom runner) never escape: they come
back as a ``ToolResult`` whose ``problem`` says what went wrong.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, List, Tuple  # runtime alias: Python 3.8

Runner = Callable[[List[str]], Tuple[int, str, str]]

DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_RC = 124
NOT_FOUND_RC = 127


def host_path(root: str, path: str) -> str:
    """``path`` (absolute, as seen on the host) under ``root``."""
    return os.path.join(root, path.lstrip("/"))


def default_runner(
    argv: list[str], timeout: float = DEFAULT_TIMEOUT_S, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``argv`` with a timeout; never raises for ordinary failures."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return TIMEOUT_RC, "", f"timed out after {timeout:g} s"
    except OSError as err:
        return NOT_FOUND_RC, "", str(err)
    return proc.returncode, proc.stdout, proc.stderr


# Directories that hold only a GPU vendor's libraries: safe on LD_LIBRARY_PATH for a host
# program run from a container (the host's libc must not meet the container's loader).
# /usr/local/nvidia/lib64: the NVIDIA driver where it is kept in /usr/local/nvidia.
VENDOR_LIB_DIRS = ("/opt/mxdriver/lib", "/opt/maca/lib", "/opt/mxn100/lib",
                   "/usr/local/nvidia/lib64")


def vendor_library_dirs(root: str) -> list[str]:
    """``VENDOR_LIB_DIRS`` that exist under ``root``, as paths under it."""
    return [p for p in (host_path(root, d) for d in VENDOR_LIB_DIRS) if os.path.isdir(p)]


def runner_for(root: str) -> Runner:
    """The default runner for tools under ``root``: when the host is mounted elsewhere
    (``/host`` in a container) its vendor libraries are put on ``LD_LIBRARY_PATH``."""
    if os.path.realpath(root) == "/":
        return default_runner
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(
        vendor_library_dirs(root) + [v for v in [env.get("LD_LIBRARY_PATH")] if v]
    )

    def run(argv: list[str]) -> tuple[int, str, str]:
        return default_runner(argv, env=env)

    return run


def find_tool(root: str, name: str, candidates: Sequence[str]) -> str | None:
    """First executable ``candidates`` entry under ``root``; on PATH only when root is /.

    Under a host mounted elsewhere (``/host``) an ELF program is taken before a script: a
    host may put a wrapper script first on its PATH that execs the real program by its
    absolute host path (``/usr/bin/nvidia-smi`` -> ``exec /usr/local/nvidia/bin/nvidia-smi``
    on a GPU machine with driver 580.159.04), which does not exist in the caller's own
    mount namespace. A script is still used when no candidate is ELF."""
    found = [host_path(root, c) for c in candidates]
    found = [p for p in found if os.path.isfile(p) and os.access(p, os.X_OK)]
    if os.path.realpath(root) == "/":
        return found[0] if found else shutil.which(name)
    return next((p for p in found if is_elf(p)), found[0] if found else None)


def is_elf(path: str) -> bool:
    """An ELF file (a compiled program or library), not a script."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


@dataclass(frozen=True)
class ToolResult:
    rc: int
    stdout: str
    stderr: str
    problem: str | None = None  # set when the run failed outright

    @property
    def ok(self) -> bool:
        return self.problem is None


def run_tool(runner: Runner | None, argv: list[str]) -> ToolResult:
    """Run through ``runner`` (default: subprocess) and describe any failure in one line."""
    shown = " ".join([os.path.basename(argv[0]), *argv[1:]])
    try:
        rc, out, err = (runner or default_runner)(argv)
    except subprocess.TimeoutExpired:
        return ToolResult(TIMEOUT_RC, "", "", f"`{shown}` timed out")
    except Exception as exc:  # a custom runner may raise anything; report, don't crash
        return ToolResult(NOT_FOUND_RC, "", "", f"`{shown}` could not run: {exc}")
    if rc == TIMEOUT_RC:
        return ToolResult(rc, out, err, f"`{shown}` timed out ({err.strip() or 'rc 124'})")
    if rc != 0:
        detail = (err.strip() or out.strip()).splitlines()
        first = detail[0] if detail else "no output"
        return ToolResult(rc, out, err, f"`{shown}` exited with {rc}: {first}")
    return ToolResult(rc, out, err)
