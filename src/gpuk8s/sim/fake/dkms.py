#!/usr/bin/env python3
"""Stand-in ``dkms`` for simulated NVIDIA roots, installed as ``<root>/usr/sbin/dkms``.

``dkms status`` lists ``nvidia/<version>, <kernel>, x86_64: installed``; ``dkms install
-m nvidia -v VERSION [-k KERNEL]`` builds the modules from ``/usr/src/nvidia-VERSION``
against the kernel's headers (``/lib/modules/KERNEL/build``: refused without them) into
``/lib/modules/KERNEL/updates/dkms``; ``dkms remove -m nvidia -v VERSION --all`` takes
them out; ``--version`` prints the version. Only the simulated tree is edited.
"""

from __future__ import annotations

import os
import sys


def root_dir() -> str:
    here = os.path.realpath(__file__)
    for _ in range(3):  # <root>/usr/sbin/dkms
        here = os.path.dirname(here)
    return here


def option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
    return None


def main(argv: list[str]) -> int:
    root = root_dir()
    sys.path.insert(0, os.path.join(root, "var/lib/gpuk8s-sim/lib"))
    import gpuk8s_sim_nvidia as driver  # type: ignore[import-not-found]  # inside the root

    if argv[:1] in (["--version"], ["-V"]):
        print(driver.DKMS_VERSION)
        return 0
    command = argv[0] if argv else ""
    try:
        if command == "status":
            for line in driver.dkms_status(root):
                print(line)
            return 0
        module, version = option(argv, "-m"), option(argv, "-v")
        if module is None and len(argv) > 1 and "/" in argv[1]:
            module, _, version = argv[1].partition("/")
        if module != "nvidia" or not version:
            print(f"Error! Could not find module source directory for {module}/{version}.",
                  file=sys.stderr)
            return 1
        if command == "install":
            kernel = option(argv, "-k") or driver.kernel_release(root)
            if not driver.headers_present(root, kernel):
                print(f"Error! Your kernel headers for kernel {kernel} cannot be found at "
                      f"/lib/modules/{kernel}/build or /lib/modules/{kernel}/source.",
                      file=sys.stderr)
                return 1
            for path in driver.dkms_install(root, version, kernel):
                print(f"Installing /{path}")
            return 0
        if command == "remove":
            if not driver.dkms_remove(root, version):
                print(f"Error! There is no instance of nvidia {version}", file=sys.stderr)
                return 3
            print(f"Deleting module nvidia-{version} completely from the DKMS tree.")
            return 0
    except driver.DriverError as err:
        print(str(err), file=sys.stderr)
        return 1
    print(f"Error! Unknown action: {command}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
