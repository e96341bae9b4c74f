"""Driver payloads and the simulator's kernel stand-ins, for tests that install drivers on
simulated roots (gpuk8s.host.driver through the Ansible module, driver-manager or
directly). The kernel is never touched: ``<root>/usr/sbin/modprobe`` records the load in
the simulated /sys, after finding the module through ``modules.dep`` as kmod does."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuk8s import sim
from gpuk8s.sim import kobject, tree

MODPROBE = "{host_root}/usr/sbin/modprobe"
LOAD = (sys.executable, MODPROBE, "{module}")
UNLOAD = (sys.executable, MODPROBE, "-r", "{module}")
RELEASE = tree.KERNEL_RELEASE  # a new simulated root's kernel


def driver_payload(base: Path, version: str, *, module_version: str | None = None,
                   release: str = RELEASE, sdk: str | None = None) -> Path:
    """A directory payload laid out like the host, as a vendor bundle is: the simulator's
    (``gpuk8s sim payload driver``), plus a library in a directory of its own, and an SDK
    ``Version.txt`` when ``sdk``. ``module_version``: what its ``metax.ko`` says, when
    another version than the bundle's (a broken bundle)."""
    sim.write_payload("driver", version, str(base), release)
    (base / "opt/mxdriver/lib").mkdir(parents=True)
    (base / "opt/mxdriver/lib/libmxsml.so").write_bytes(b"\x7fELF stand-in")
    if module_version is not None:
        kobject.write_module(str(module_path(base, release)), "metax", module_version, release)
    if sdk is not None:
        (base / "opt/maca").mkdir(parents=True)
        (base / "opt/maca/Version.txt").write_text(f"Version:{sdk}\n")
    return base


def module_path(base: Path, release: str = RELEASE) -> Path:
    """Where a payload / root holds ``metax.ko`` for ``release``."""
    return base / f"lib/modules/{release}/extra/metax.ko"


def modprobe_log(root: Path) -> list[str]:
    path = root / "var/lib/gpuk8s-sim/modprobe.log"
    return path.read_text().splitlines() if path.exists() else []
