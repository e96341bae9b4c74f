"""GPU node simulator: writes a realistic host tree under a root directory.

The tree has what discovery reads on a real node (sysfs PCI hierarchy, ``/sys/module``,
DRM nodes, ``/dev`` nodes, ``/opt/maca/Version.txt``) and executable fake vendor tools
(``mx-smi``, ``nvidia-smi``) answering from the simulator's state file
``<root>/var/lib/gpuk8s-sim/state.json``. Faults are injected by changing that state
and the tree, never by telling product code it is simulated.

Fault modes (``fail``): ``fault`` — the vendor tool reports the GPU unavailable with a
reason; ``unbind`` — the driver binding (driver links, DRM dirs) disappears;
``remove`` — the device leaves the bus (sysfs dir and bus link gone, hot-unplug).
``heal`` restores a GPU.

Kernel-side stand-ins (the tree module is copied into the root so these work without
gpuk8s installed): ``<root>/usr/sbin/modprobe [-r] metax`` loads/unloads the installed
``lib/modules/*/**/metax.ko`` (refused while ``/sys/module/metax/refcnt`` > 0);
``mx-smi vm --enable-vf N [-i 0,1] | --disable-vf | --show-vf`` and ``set_vfnum`` create
or drop VFs; ``sync`` applies ``sriov_numvfs`` values written into sysfs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from . import tree
from .presets import PRESET_TABLE, PRESETS, build_state

__all__ = [
    "FAIL_MODES",
    "PRESETS",
    "create",
    "fail",
    "heal",
    "is_sim_root",
    "set_vfnum",
    "state",
    "sync",
    "tool_source",
]

FAIL_MODES = ("fault", "unbind", "remove")
DEFAULT_REASON = "GPU hang detected: uncorrectable ECC error (simulated)"


def is_sim_root(root: str) -> bool:
    return os.path.isfile(os.path.join(root, tree.STATE_FILE))


def create(
    root: str,
    preset: str,
    vfnum: int | None = None,
    device_nodes: str = "files",
    *,
    force: bool = False,
) -> None:
    """Write preset ``preset`` under ``root``.

    ``root`` must be missing or empty unless ``force`` (then an existing simulated root
    is replaced; a non-empty directory that is not one is refused).
    """
    if preset not in PRESET_TABLE:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if device_nodes not in ("files", "char"):
        raise ConfigError("device_nodes must be 'files' or 'char'")
    if os.path.realpath(root) == "/":
        raise ConfigError("refusing to write a simulated node over /")
    if os.path.isdir(root) and os.listdir(root):
        if not force:
            raise ConfigError(f"{root} is not empty (use --force to replace a simulated root)")
        if not is_sim_root(root):
            raise ConfigError(f"{root} is not a simulated root; refusing to delete it")
        shutil.rmtree(root)
    try:
        new_state = build_state(preset, vfnum, device_nodes)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    os.makedirs(root, exist_ok=True)
    tree.write_tree(root, new_state)
    _install_files(root, new_state)


def tool_source(name: str) -> str:
    """Text of a stand-in tool: ``mx-smi``, ``nvidia-smi`` or ``modprobe`` (for test
    payloads that install their own copy)."""
    module = {"mx-smi": "mx_smi.py", "nvidia-smi": "nvidia_smi.py", "modprobe": "modprobe.py"}
    if name not in module:
        raise ConfigError(f"no stand-in for {name!r}; choose one of {', '.join(module)}")
    # a plain path: importlib.resources.files() is 3.9+, and the host-Python tests run the
    # simulator under 3.8
    return (Path(__file__).parent / "fake" / module[name]).read_text("utf-8")


def _install_files(root: str, current: dict[str, Any]) -> None:
    """Files a real node has on disk: vendor tools, SDK, module file; plus the
    simulated kernel library the stand-in tools import."""
    lib = os.path.join(root, tree.LIB_DIR, f"{tree.LIB_NAME}.py")
    tree.write_file(lib, Path(tree.__file__).read_text(encoding="utf-8"))
    driver = current["driver"]
    if current["vendor"] == "metax":
        tree.write_file(os.path.join(root, tree.MODPROBE_PATH), tool_source("modprobe"), 0o755)
        if driver["loaded"]:
            tree.write_file(os.path.join(root, tree.MXSMI_PATH), tool_source("mx-smi"), 0o755)
            tree.write_file(os.path.join(root, "opt/mxdriver/Version.txt"),
                            f"Version:{driver['version']}\n")
            tree.write_file(os.path.join(root, tree.METAX_KO),
                            f"\x7fELF (simulated)\x00version={driver['version']}\x00"
                            "license=GPL\x00name=metax\x00")
    if current["vendor"] == "metax" and current["sdk"]:
        tree.write_file(os.path.join(root, "opt/maca/Version.txt"), f"Version:{current['sdk']}\n")
        os.makedirs(os.path.join(root, "opt/maca/lib"), exist_ok=True)
    if current["vendor"] == "nvidia" and driver["loaded"]:
        tree.write_file(os.path.join(root, tree.NVSMI_PATH), tool_source("nvidia-smi"), 0o755)


def set_vfnum(root: str, vfnum: int, gpus: list[int] | None = None) -> None:
    """Configure ``vfnum`` VFs per GPU (all GPUs, or those listed), as the driver would."""
    state(root)
    try:
        tree.set_vfnum(root, vfnum, gpus)
    except tree.SimError as err:
        raise ConfigError(str(err)) from err


def sync(root: str) -> bool:
    """Apply ``sriov_numvfs`` values written into the simulated sysfs (the kernel's job
    on a real node: VFs appear or vanish). True when something changed."""
    state(root)
    try:
        return tree.sync_sriov(root)
    except tree.SimError as err:
        raise ConfigError(str(err)) from err


def state(root: str) -> dict[str, Any]:
    """The simulator state (JSON-ready dict)."""
    if not is_sim_root(root):
        raise ConfigError(f"{root} is not a simulated root (no {tree.STATE_FILE})")
    return tree.load_state(root)


def _gpu(current: dict[str, Any], gpu: int) -> dict[str, Any]:
    entries: list[dict[str, Any]] = current["gpus"]
    for entry in entries:
        if entry["index"] == gpu:
            return entry
    raise ConfigError(f"no GPU {gpu} (this node has {len(current['gpus'])})")


def fail(root: str, gpu: int, mode: str = "fault", reason: str | None = None) -> None:
    """Make GPU ``gpu`` (index in PCI order) fail in ``mode`` (see module doc)."""
    if mode not in FAIL_MODES:
        raise ConfigError(f"unknown fail mode {mode!r}; choose one of {', '.join(FAIL_MODES)}")
    current = state(root)
    entry = _gpu(current, gpu)
    entry["status"] = {"fault": "fault", "unbind": "unbound", "remove": "removed"}[mode]
    entry["reason"] = (reason or DEFAULT_REASON) if mode == "fault" else None
    tree.write_gpu(root, current, entry)
    tree.save_state(root, current)


def heal(root: str, gpu: int | None = None) -> None:
    """Restore GPU ``gpu``, or every GPU when ``gpu`` is None."""
    current = state(root)
    entries = current["gpus"] if gpu is None else [_gpu(current, gpu)]
    for entry in entries:
        entry["status"] = "ok"
        entry["reason"] = None
        tree.write_gpu(root, current, entry)
    tree.save_state(root, current)
