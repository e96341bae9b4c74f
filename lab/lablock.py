#!/usr/bin/env python3
"""The lab's one lock: every user of the shared lab holds it while it works there.

The e2e tier (``tests/e2e/conftest.py``), the benchmarks that drive the lab
(``benchmarks/replay.py``, ``scheduling.py``, ``dra.py``) and anyone at a shell take the
same file, ``$GPUK8S_LAB_STATE/e2e.lock`` (``/var/lib/gpuk8s-lab/e2e.lock``), with
``flock(2)``: a second user waits until the first is done, whichever kind each is.

    from lablock import hold
    with hold():                       # waits, saying so once, while another holds it
        ...
    python3 lab/lablock.py CMD ARGS...   # CMD under the lock (as ``flock PATH CMD``)

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from versions import state_dir  # lab/versions.py: where the lab's state directory is

NAME = "e2e.lock"


def lock_path(environ: Mapping[str, str] | None = None) -> Path:
    """The lock file of the lab whose state directory ``GPUK8S_LAB_STATE`` names."""
    return state_dir(os.environ if environ is None else environ) / NAME


@contextlib.contextmanager
def hold(
    path: Path | None = None, announce: Callable[[str], None] = print
) -> Iterator[Path]:
    """Hold the lab lock (``path``, default ``lock_path()``) inside the block; when another
    process holds it, ``announce`` a line once and wait. Yields the path."""
    where = lock_path() if path is None else Path(path)
    with open(where, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            announce(f"another lab session holds {where}: waiting")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield where
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    with hold(announce=lambda line: print(line, file=sys.stderr, flush=True)):
        return subprocess.call(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
