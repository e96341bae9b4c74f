#!/usr/bin/env python3
"""Stand-in ``apt-get`` for simulated NVIDIA roots, installed as ``<root>/usr/bin/apt-get``.

Knows the packages the accelerator manual's driver install needs (``gcc``, ``make``,
``build-essential``, ``dkms``, ``linux-headers-<running kernel>``; the files each one
puts on the node are in ``gpuk8s_sim_nvidia.package_files``) and answers like apt-get:
``install [-y] [-q] PKG...`` (exit 100 with ``E: Unable to locate package X`` for any
other name, nothing installed), ``update``. The real package database is never touched.
"""

from __future__ import annotations

import os
import sys


def root_dir() -> str:
    here = os.path.realpath(__file__)
    for _ in range(3):  # <root>/usr/bin/apt-get
        here = os.path.dirname(here)
    return here


def main(argv: list[str]) -> int:
    root = root_dir()
    sys.path.insert(0, os.path.join(root, "var/lib/gpuk8s-sim/lib"))
    import gpuk8s_sim_nvidia as driver  # type: ignore[import-not-found]  # inside the root

    words = [a for a in argv if not a.startswith("-")]
    if not words:
        print("E: Invalid operation", file=sys.stderr)
        return 100
    command, names = words[0], words[1:]
    if command == "update":
        print("Reading package lists... Done")
        return 0
    if command != "install":
        print(f"E: Invalid operation {command}", file=sys.stderr)
        return 100
    kernel = driver.kernel_release(root)
    unknown = [n for n in names if not driver.package_files(n, kernel)]
    print("Reading package lists... Done\nBuilding dependency tree... Done")
    if unknown:
        print(f"E: Unable to locate package {unknown[0]}", file=sys.stderr)
        return 100
    for name in names:
        driver.install_package(root, name)
        print(f"Setting up {name} (simulated) ...")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
