#!/usr/bin/env python3
"""Stand-in kmod for simulated roots, installed as ``<root>/usr/bin/kmod`` with
``<root>/usr/sbin/modprobe`` and ``<root>/usr/sbin/depmod`` linking to it (as Debian's
kmod is one program called by those names). It edits the simulated tree only: the real
kernel is never touched.

``modprobe metax [param=value ...]`` (only the ``metax`` module) finds the module as kmod
does, through ``/lib/modules/<release>/modules.dep`` of the running release
(``/proc/sys/kernel/osrelease``; no ``depmod`` run: "Module metax not found"). Then the
simulated kernel checks the file as ``init_module`` would: an ELF module built for this
kernel, else ``Invalid module format``, with the reason in the simulated kernel log. Then
it "loads" it: ``/sys/module/metax`` (version: its ``.modinfo`` ``version``), every GPU
bound, DRM dirs and /dev nodes. ``modprobe -r metax`` unloads it (refused while
``/sys/module/metax/refcnt`` > 0). ``modprobe --show-depends [-d DIR] [-S RELEASE] NAME``
prints kmod's lookup (``insmod PATH`` lines, dependencies first) and changes nothing.
``-V`` prints Debian 12's kmod 30 version and features (no gzip: ``-ZLIB``).
Each load/unload that changes something appends ``load metax <version>`` /
``unload metax`` to ``<root>/var/lib/gpuk8s-sim/modprobe.log``.

``depmod [-a] [-b BASEDIR] [RELEASE]`` writes ``BASEDIR/lib/modules/RELEASE/modules.dep``
(BASEDIR: ``-b``, else this root; RELEASE: else the root's running kernel), for places
without Debian's kmod (the lab's driver-manager image); tests check that it writes the
entries the real one writes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

FEATURES = "+ZSTD +XZ -ZLIB +LIBCRYPTO -EXPERIMENTAL"  # `kmod -V` of Debian 12's kmod 30


def root_dir() -> str:
    here = os.path.realpath(__file__)
    for _ in range(3):  # <root>/usr/bin/kmod
        here = os.path.dirname(here)
    return here


def modprobe(k: Any, root: str, argv: list[str]) -> int:
    """``k``: the simulated kernel (gpuk8s_sim_tree)."""
    remove = show = False
    base, release, words, args = root, None, [], list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-r", "--remove"):
            remove = True
        elif arg in ("-D", "--show-depends"):
            show = True
        elif arg in ("-d", "--dirname", "-S", "--set-version"):
            if not args:
                print(f"modprobe: ERROR: {arg} needs a value", file=sys.stderr)
                return 1
            value = args.pop(0)
            if arg in ("-d", "--dirname"):
                base = value
            else:
                release = value
        elif not arg.startswith("-"):
            words.append(arg)
    if not words:
        print("modprobe: ERROR: missing module name", file=sys.stderr)
        return 1
    module, params = words[0], words[1:]
    if show:  # kmod's lookup only (loaded or not): "insmod PATH" per file, dependencies first
        try:
            found = k.resolve_module(base, module, release)
        except k.SimError as err:
            print(str(err), file=sys.stderr)
            return 1
        print("".join(f"insmod {path} \n" for path in found), end="")  # kmod's spacing
        return 0
    if module != "metax":
        print(f"modprobe: FATAL: Module {module} not found in directory "
              f"/lib/modules/{k.kernel_release(root)}", file=sys.stderr)
        return 1
    try:
        if remove:
            changed = k.unload_module(root)
            entry = f"unload {module}"
        else:
            changed = k.load_module(root, dict(p.split("=", 1) for p in params if "=" in p))
            entry = f"load {module} {k.load_state(root)['driver']['version']}"
    except k.SimError as err:
        print(str(err), file=sys.stderr)
        return 1
    if changed:
        with open(os.path.join(root, "var/lib/gpuk8s-sim/modprobe.log"), "a") as log:
            log.write(f"{entry}\n")
    return 0


def depmod(kernel: Any, root: str, argv: list[str]) -> int:
    base, words, args = root, [], list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-b", "--basedir"):
            if not args:
                print("depmod: ERROR: -b needs a directory", file=sys.stderr)
                return 1
            base = args.pop(0)
        elif arg.startswith("--basedir="):
            base = arg.split("=", 1)[1]
        elif not arg.startswith("-"):
            words.append(arg)
    release = words[0] if words else kernel.kernel_release(base)
    if not os.path.isdir(os.path.join(base, "lib/modules", release)):
        print(f"depmod: ERROR: could not open directory {base.rstrip('/')}/lib/modules/"
              f"{release}: No such file or directory", file=sys.stderr)
        return 1
    kernel.depmod(base, release)
    return 0


def main(argv: list[str]) -> int:
    root = root_dir()
    sys.path.insert(0, os.path.join(root, "var/lib/gpuk8s-sim/lib"))
    import gpuk8s_sim_tree as kernel  # type: ignore[import-not-found]  # inside the root

    if argv[1:2] in (["-V"], ["--version"]):  # kmod / modprobe / depmod -V: what it reads
        print(f"kmod version 30\n{FEATURES}")
        return 0
    name = os.path.basename(argv[0])
    if name == "kmod" and len(argv) > 1:  # `kmod modprobe ...`, as the real one takes it
        name, argv = argv[1], argv[1:]
    commands = {"modprobe": modprobe, "depmod": depmod}
    if name not in commands:
        print(f"kmod: ERROR: unknown command '{name}' (stand-in: modprobe, depmod)",
              file=sys.stderr)
        return 1
    return commands[name](kernel, root, argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
