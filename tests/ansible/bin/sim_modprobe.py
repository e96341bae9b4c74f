#!/usr/bin/env python3
"""Stand-in for ``modprobe`` on a simulator root (tests only; the kernel is never touched).

    sim_modprobe.py --root ROOT [-r] MODULE

Load: reads the version of ``ROOT/lib/modules/*/**/MODULE.ko`` (a ``version=`` line, as
``modinfo`` would show it; falling back to ``ROOT/opt/mxdriver/Version.txt``) and makes
the simulated host show that driver loaded: ``/sys/module/MODULE/version``, GPUs bound,
``/dev/mxcd``. Unload (``-r``): the module directory and driver bindings disappear.
Every call is appended to ``ROOT/var/lib/gpuk8s-sim/modprobe.log``.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys

from gpuk8s.sim import state, tree


def module_version(root: str, module: str) -> str | None:
    for path in sorted(glob.glob(os.path.join(root, "lib/modules", "**", f"{module}.ko"),
                                 recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("version="):
                    return line.split("=", 1)[1].strip()
    try:
        with open(os.path.join(root, "opt/mxdriver/Version.txt"), encoding="utf-8") as handle:
            return handle.read().split(":", 1)[-1].strip() or None
    except OSError:
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("-r", dest="remove", action="store_true")
    parser.add_argument("module")
    args = parser.parse_args(argv)
    current = state(args.root)
    log = os.path.join(args.root, "var/lib/gpuk8s-sim/modprobe.log")
    if args.remove:
        if not current["driver"]["loaded"]:
            print(f"modprobe: FATAL: Module {args.module} is not currently loaded", file=sys.stderr)
            return 1
        current["driver"]["loaded"] = False
        for rel in (f"sys/module/{args.module}", f"sys/bus/pci/drivers/{args.module}"):
            shutil.rmtree(os.path.join(args.root, rel), ignore_errors=True)
        entry = f"unload {args.module}\n"
    else:
        version = module_version(args.root, args.module)
        if version is None:
            print(f"modprobe: FATAL: Module {args.module} not found", file=sys.stderr)
            return 1
        current["driver"].update(loaded=True, version=version)
        entry = f"load {args.module} {version}\n"
    # the simulator rewrites /opt/maca/Version.txt from its state: keep what was installed
    sdk = os.path.join(args.root, "opt/maca/Version.txt")
    if os.path.isfile(sdk):
        with open(sdk, encoding="utf-8") as handle:
            current["sdk"] = handle.read().split(":", 1)[-1].strip() or current["sdk"]
    tree.write_tree(args.root, current)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(entry)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
