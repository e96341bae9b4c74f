"""Simulated node shapes. The preset names are a contract (lab, tests, demos use them).

A preset becomes a *state* (a JSON-ready dict saved at
``<root>/var/lib/gpuk8s-sim/state.json``): every PCI device with its place in the
hierarchy, GPU identities, links, driver/SDK versions and per-GPU fault status. The
tree writer (``tree.py``) and the fake vendor tools read only that state.

PCI layout (socket ``s`` has root bus 0x00 for s=0, 0x80 for s=1; switch ``j`` is the
j-th switch of its socket)::

    pci0000:RR / RR:(01+2j).0 root port
               / UU:00.0        switch upstream port    UU = RR + 0x01 + 0x10*j
               / DD:0k.0        switch downstream port  DD = UU + 1, k = GPU in switch
               / GG:00.0        GPU                     GG = UU + 2 + k
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from .fake.nvidia_driver import DRIVER_CUDAS
from .tree import assign_cards, make_vfs

METAX_DRIVER_VERSION = "2.32.0.6"
MACA_VERSION = "2.32.0.6"
NVIDIA_DRIVER_VERSION = "550.54.15"
NVIDIA_DRIVER_CUDA = "12.4"  # the CUDA version driver 550.54.15 supports (nvidia-smi's header)
# The newest CUDA each simulated NVIDIA driver supports (one table, with the fake installer)
NVIDIA_DRIVER_CUDAS = DRIVER_CUDAS

INTEL = 0x8086
BROADCOM_PLX = 0x1000


@dataclass(frozen=True)
class Product:
    vendor: str  # "metax" | "nvidia"
    vendor_id: int
    device_id: int
    name: str  # as the vendor tool prints it
    memory_mib: int
    total_vfs: int  # 0: no SR-IOV capability (sriov_totalvfs absent)
    vf_device_id: int = 0
    class_code: int = 0x038000
    compute_capability: str = ""  # NVIDIA: CUDA compute capability, as nvidia-smi's compute_cap
    min_driver: int = 0  # NVIDIA: the first driver branch that supports the product


PRODUCTS = {
    # VF device ids are made up (PF id + 0x10); nothing reads them but lspci-style tools
    "C500": Product("metax", 0x9999, 0x4001, "MXC500", 65536, 8, 0x4011),
    "C550": Product("metax", 0x9999, 0x4000, "MXC550", 65536, 8, 0x4010),
    "N260": Product("metax", 0x9999, 0x4083, "MXN260", 65536, 0),
    # NVIDIA: names and memory as nvidia-smi prints them; compute capability per NVIDIA's
    # CUDA GPUs table (H100 9.0, A100 8.0, T4 7.5, V100 7.0, P100 6.0)
    "H100": Product("nvidia", 0x10DE, 0x2330, "NVIDIA H100 80GB HBM3", 81559, 0,
                    class_code=0x030200, compute_capability="9.0", min_driver=525),
    "A100": Product("nvidia", 0x10DE, 0x20B2, "NVIDIA A100-SXM4-80GB", 81920, 0,
                    class_code=0x030200, compute_capability="8.0", min_driver=450),
    "T4": Product("nvidia", 0x10DE, 0x1EB8, "Tesla T4", 15360, 0,
                  class_code=0x030200, compute_capability="7.5", min_driver=418),
    "V100": Product("nvidia", 0x10DE, 0x1DB5, "Tesla V100-SXM2-32GB", 32768, 0,
                    class_code=0x030200, compute_capability="7.0", min_driver=384),
    "P100": Product("nvidia", 0x10DE, 0x15F8, "Tesla P100-PCIE-16GB", 16384, 0,
                    class_code=0x030200, compute_capability="6.0", min_driver=375),
}


@dataclass(frozen=True)
class Preset:
    description: str
    product: str | None  # None: no GPU
    switches: int = 0
    per_switch: int = 0
    switch_numa: tuple[int, ...] = ()  # NUMA node (= socket) of each switch
    link_groups: tuple[tuple[int, ...], ...] = ()  # sets of GPU indices linked all-to-all
    vfnum: int = 0
    driver: bool = True  # kernel module loaded, GPUs bound, vendor tool installed
    nvswitches: int = 0
    driver_version: str = ""  # NVIDIA: the installed driver (default NVIDIA_DRIVER_VERSION)


PRESET_TABLE: dict[str, Preset] = {
    "c500-8": Preset(
        "8x C500, 2 PCIe switches x 4 (NUMA 0/1), MetaXLink within each four",
        "C500", 2, 4, (0, 1), ((0, 1, 2, 3), (4, 5, 6, 7)),
    ),
    "c550-8": Preset(
        "8x C550, 2 PCIe switches x 4 (NUMA 0/1), all eight MetaXLinked",
        "C550", 2, 4, (0, 1), (tuple(range(8)),),
    ),
    "mixed-16": Preset(
        "16x C500, 4 PCIe switches x 4, MetaXLink groups of 8 (switches 0+1 on NUMA 0, "
        "2+3 on NUMA 1)",
        "C500", 4, 4, (0, 0, 1, 1), (tuple(range(8)), tuple(range(8, 16))),
    ),
    "n260-2": Preset("2x N260 under one PCIe switch, no links, SR-IOV forbidden",
                     "N260", 1, 2, (0,)),
    "c500-8-vf4": Preset(
        "c500-8 with SR-IOV on: 4 VFs per GPU",
        "C500", 2, 4, (0, 1), ((0, 1, 2, 3), (4, 5, 6, 7)), vfnum=4,
    ),
    "nodriver-8": Preset(
        "8x C500 on the bus, metax module not loaded, nothing bound, no mx-smi",
        "C500", 2, 4, (0, 1), ((0, 1, 2, 3), (4, 5, 6, 7)), driver=False,
    ),
    "nogpu": Preset("no GPU: a VGA (BMC), a NIC and an NVMe disk only", None),
    "nvidia-8": Preset(
        "8x H100 SXM, 2 PCIe switches x 4 (NUMA 0/1), NVLink all-to-all via 4 NVSwitches",
        "H100", 2, 4, (0, 1), (tuple(range(8)),), nvswitches=4,
    ),
    "nvidia-8-nodriver": Preset(
        "nvidia-8 before its driver is installed: 8x H100 on the bus, no nvidia module, "
        "nothing bound, no driver files (what the nvidia_host role starts from)",
        "H100", 2, 4, (0, 1), (tuple(range(8)),), driver=False, nvswitches=4,
    ),
    "a100-8": Preset(
        "8x A100 SXM4 80GB, 2 PCIe switches x 4, NVLink all-to-all via 6 NVSwitches, "
        "driver 535.183.01 (CUDA 12.2)",
        "A100", 2, 4, (0, 1), (tuple(range(8)),), nvswitches=6, driver_version="535.183.01",
    ),
    "v100-8": Preset(
        "8x V100 SXM2 32GB, 2 PCIe switches x 4, NVLink within each four, driver 535.183.01 "
        "(CUDA 12.2)",
        "V100", 2, 4, (0, 1), ((0, 1, 2, 3), (4, 5, 6, 7)), driver_version="535.183.01",
    ),
    "t4-2": Preset(
        "2x Tesla T4 (the accelerator manual's example card) under one PCIe switch, no NVLink, "
        "driver 515.65.01 (CUDA 11.7)",
        "T4", 1, 2, (0,), driver_version="515.65.01",
    ),
    "p100-4": Preset(
        "4x Tesla P100 PCIe (Pascal: older than Volta), 2 PCIe switches x 2, no NVLink, "
        "driver 470.256.02 (CUDA 11.4)",
        "P100", 2, 2, (0, 1), driver_version="470.256.02",
    ),
}

PRESETS: dict[str, str] = {name: p.description for name, p in PRESET_TABLE.items()}


def _bdf(bus: int, dev: int = 0, fn: int = 0) -> str:
    return f"0000:{bus:02x}:{dev:02x}.{fn}"


def _digest(*parts: object) -> str:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()


def _uuid(preset: str, index: int) -> str:
    h = _digest("uuid", preset, index)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _serial(product: Product, preset: str, index: int) -> str:
    h = _digest("serial", preset, index)
    if product.vendor == "nvidia":
        return "1654" + str(int(h[:12], 16))[:9].rjust(9, "0")
    return f"{product.name[2:]}{int(h[:8], 16) % 10**10:010d}"


def _dev(address: str, path: str, vendor: int, device: int, cls: int, numa: int,
         driver: str | None = None) -> dict[str, Any]:
    return {"bdf": address, "path": path, "vendor": vendor, "device": device, "class": cls,
            "numa": numa, "driver": driver}


def build_state(name: str, vfnum: int | None = None, device_nodes: str = "files"
                ) -> dict[str, Any]:
    """The full simulated state of preset ``name``."""
    preset = PRESET_TABLE[name]
    product = PRODUCTS[preset.product] if preset.product else None
    vendor = product.vendor if product else "none"
    vfs = preset.vfnum if vfnum is None else vfnum
    if product is None or product.total_vfs == 0:
        if vfs:
            raise ValueError(f"preset {name} has no SR-IOV capable GPU (vfnum must be 0)")
        vfs = 0
    elif vfs not in (0, 1, 2, 4, 8) or vfs > product.total_vfs:
        raise ValueError(f"vfnum {vfs} not supported by {preset.product} "
                         f"(0, 1, 2, 4, 8 up to {product.total_vfs})")
    devices: list[dict[str, Any]] = []  # non-GPU PCI functions (bridges, VGA, NIC, disk)
    gpus: list[dict[str, Any]] = []
    for socket, root_bus in ((0, 0x00), (1, 0x80)):
        host = f"pci0000:{root_bus:02x}"
        devices.append(_dev(_bdf(root_bus), f"{host}/{_bdf(root_bus)}", INTEL, 0x09A2,
                            0x060000, socket))
    # BMC VGA (ASPEED): takes card0, like on real servers
    rp = _bdf(0x00, 0x1C)
    devices.append(_dev(rp, f"pci0000:00/{rp}", INTEL, 0x347A, 0x060400, 0, "pcieport"))
    vga = _bdf(0x3F)
    devices.append({**_dev(vga, f"pci0000:00/{rp}/{vga}", 0x1A03, 0x2000, 0x030000, 0, "ast"),
                    "drm": ["card0"]})
    rp = _bdf(0x00, 0x1D)
    nic = _bdf(0x31)
    devices.append(_dev(rp, f"pci0000:00/{rp}", INTEL, 0x347B, 0x060400, 0, "pcieport"))
    devices.append(_dev(nic, f"pci0000:00/{rp}/{nic}", 0x15B3, 0x101D, 0x020000, 0,
                        "mlx5_core"))
    rp = _bdf(0x80, 0x1D)
    nvme = _bdf(0xB1)
    devices.append(_dev(rp, f"pci0000:80/{rp}", INTEL, 0x347B, 0x060400, 1, "pcieport"))
    devices.append(_dev(nvme, f"pci0000:80/{rp}/{nvme}", 0x144D, 0xA80A, 0x010802, 1, "nvme"))

    local_switch = {0: 0, 1: 0}
    for switch in range(preset.switches):
        assert product is not None
        numa = preset.switch_numa[switch]
        root_bus = 0x00 if numa == 0 else 0x80
        j = local_switch[numa]
        local_switch[numa] += 1
        host = f"pci0000:{root_bus:02x}"
        root_port = _bdf(root_bus, 0x01 + 2 * j)
        up_bus = root_bus + 0x01 + 0x10 * j
        up = _bdf(up_bus)
        base = f"{host}/{root_port}"
        devices.append(_dev(root_port, base, INTEL, 0x347A, 0x060400, numa, "pcieport"))
        devices.append(_dev(up, f"{base}/{up}", BROADCOM_PLX, 0xC030, 0x060400, numa,
                            "pcieport"))
        for k in range(preset.per_switch):
            down = _bdf(up_bus + 1, k)
            devices.append(_dev(down, f"{base}/{up}/{down}", BROADCOM_PLX, 0xC030, 0x060400,
                                numa, "pcieport"))
            index = switch * preset.per_switch + k
            address = _bdf(up_bus + 2 + k)
            gpus.append({
                "index": index,
                "bdf": address,
                "path": f"{base}/{up}/{down}/{address}",
                "vendor": product.vendor_id,
                "device": product.device_id,
                "class": product.class_code,
                "numa": numa,
                "switch": up,
                "name": product.name,
                "memory_mib": product.memory_mib,
                "serial": _serial(product, name, index),
                "uuid": _uuid(name, index),
                "total_vfs": product.total_vfs,
                "vf_device": product.vf_device_id,
                "status": "ok",
                "reason": None,
            })
            if product.compute_capability:
                gpus[-1]["compute_capability"] = product.compute_capability
                gpus[-1]["min_driver"] = product.min_driver
    gpus.sort(key=lambda g: g["bdf"])
    for position, gpu in enumerate(gpus):  # indices follow PCI order, like the tools
        gpu["index"] = position
    if not preset.driver:
        vfs = 0  # VFs need the driver
    for gpu in gpus:
        make_vfs(gpu, vfs)
    for s in range(preset.nvswitches):
        rp = _bdf(0x00, 0x05, s)
        address = _bdf(0x21 + s)
        devices.append(_dev(rp, f"pci0000:00/{rp}", INTEL, 0x347A, 0x060400, 0, "pcieport"))
        devices.append(_dev(address, f"pci0000:00/{rp}/{address}", 0x10DE, 0x22A3, 0x068000,
                            0))
    links = [[a, b] for group in preset.link_groups for a in group for b in group if a < b]
    nvidia_version = preset.driver_version or NVIDIA_DRIVER_VERSION
    state: dict[str, Any] = {
        "format": 1,
        "preset": name,
        "vendor": vendor,
        "product": preset.product,
        "vfnum": vfs,
        "device_nodes": device_nodes,
        "driver": {
            "loaded": bool(product) and preset.driver,
            "version": (METAX_DRIVER_VERSION if vendor == "metax" else nvidia_version)
            if product and preset.driver else None,
        },
        "sdk": MACA_VERSION if vendor == "metax" and preset.driver else None,
        "links": links,
        "link_cell": "NV18" if vendor == "nvidia" else "MX",
        "gpus": gpus,
        "devices": devices,
    }
    if vendor == "nvidia" and state["driver"]["loaded"]:
        state["driver"]["cuda"] = NVIDIA_DRIVER_CUDAS[nvidia_version]
    if state["driver"]["loaded"]:
        assign_cards(state)
    return state
