#!/usr/bin/env python3
"""Stand-in ``modprobe`` for simulated roots, installed as ``<root>/usr/sbin/modprobe``.

Handles the ``metax`` module only: ``modprobe metax [param=value ...]`` loads the module
found under ``<root>/lib/modules/*/**/metax.ko`` (version: its ``version=`` modinfo
string) — creating ``/sys/module/metax``, binding every GPU, DRM dirs and /dev nodes —
and ``modprobe -r metax`` unloads it (refused while ``/sys/module/metax/refcnt`` > 0).
Each load/unload that changes something appends ``load metax <version>`` /
``unload metax`` to ``<root>/var/lib/gpuk8s-sim/modprobe.log``. The real kernel
is never touched: this file only edits the simulated tree.
"""

from __future__ import annotations

import os
import sys


def root_dir() -> str:
    here = os.path.realpath(__file__)
    for _ in range(3):  # <root>/usr/sbin/modprobe
        here = os.path.dirname(here)
    return here


def main(argv: list[str]) -> int:
    root = root_dir()
    sys.path.insert(0, os.path.join(root, "var/lib/gpuk8s-sim/lib"))
    import gpuk8s_sim_tree as kernel  # type: ignore[import-not-found]  # inside the root

    remove = any(a in ("-r", "--remove") for a in argv)
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        print("modprobe: ERROR: missing module name", file=sys.stderr)
        return 1
    module, params = words[0], words[1:]
    if module != "metax":
        print(f"modprobe: FATAL: Module {module} not found in directory "
              f"/lib/modules/{kernel.KERNEL_RELEASE}", file=sys.stderr)
        return 1
    try:
        if remove:
            changed = kernel.unload_module(root)
            entry = f"unload {module}"
        else:
            changed = kernel.load_module(root, dict(p.split("=", 1) for p in params if "=" in p))
            entry = f"load {module} {kernel.load_state(root)['driver']['version']}"
    except kernel.SimError as err:
        print(str(err), file=sys.stderr)
        return 1
    if changed:
        with open(os.path.join(root, "var/lib/gpuk8s-sim/modprobe.log"), "a") as log:
            log.write(f"{entry}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
