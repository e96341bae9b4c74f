"""Host discovery: build a ``NodeInventory`` from a host root (default ``/``).

Stdlib only with relative imports, so Ansible can ship these files to hosts as
module_utils. Every path is taken under ``root``; vendor tools are run through a
``runner`` (see ``tools.Runner``). Nothing here raises on a broken host: what could
not be read is described in ``NodeInventory.problems``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from ..core.model import Gpu, NodeInventory
from ..core.telemetry import NodeTelemetry
from . import metax, nvidia, sysfs
from .tools import Runner, default_runner, find_tool, run_tool, runner_for

__all__ = ["Runner", "check_health", "default_runner", "discover", "link_groups", "telemetry"]


def discover(
    root: str = "/", *, runner: Runner | None = None, queries: Collection[str] = metax.QUERIES
) -> NodeInventory:
    """Inventory of the node's GPUs: MetaX if any, else NVIDIA, else backend ``none``.

    ``queries``: the mx-smi runs to make on a MetaX node (``metax.QUERIES``, all by
    default); a caller that needs less asks for less (metax-docker: none, or ``hwinfo``
    for serial numbers), as each run costs a start of the tool."""
    runner = runner or runner_for(root)
    pci = sysfs.scan(root)
    metax_gpus = [d for d in pci.devices if metax.is_gpu(d)]
    nvidia_gpus = [d for d in pci.devices if nvidia.is_gpu(d)]
    if metax_gpus:
        inventory = metax.discover(root, pci.devices, runner, queries)
        if nvidia_gpus:
            inventory = inventory.with_problem(
                f"{len(nvidia_gpus)} NVIDIA GPU(s) also present, ignored (MetaX backend chosen)"
            )
    elif nvidia_gpus:
        inventory = nvidia.discover(root, pci.devices, runner)
    else:
        inventory = NodeInventory(backend="none")
    inventory = _grouped(inventory)
    return replace(inventory, problems=(*pci.problems, *inventory.problems))


def telemetry(root: str, backend: str, *, runner: Runner | None = None) -> NodeTelemetry:
    """GPU load from the vendor tool of ``backend`` (``NodeInventory.backend``)."""
    runner = runner or runner_for(root)
    if backend == "metax":
        return metax.telemetry(root, runner)
    if backend == "nvidia":
        return nvidia.telemetry(root, runner)
    return NodeTelemetry(backend=backend, source="")


def link_groups(gpus: tuple[Gpu, ...], links: frozenset[frozenset[int]]) -> dict[int, int]:
    """GPU index -> id of its connected component of vendor links (0, 1, ... by lowest
    member index); GPUs without any link are absent."""
    neighbours: dict[int, set[int]] = {}
    for pair in links:
        a, b = sorted(pair)
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    groups: dict[int, int] = {}
    next_id = 0
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.index in groups or gpu.index not in neighbours:
            continue
        stack = [gpu.index]
        while stack:
            current = stack.pop()
            if current in groups:
                continue
            groups[current] = next_id
            stack.extend(neighbours.get(current, ()))
        next_id += 1
    return groups


def _grouped(inventory: NodeInventory) -> NodeInventory:
    groups = link_groups(inventory.gpus, inventory.links)
    gpus = tuple(replace(g, link_group=groups.get(g.index)) for g in inventory.gpus)
    return replace(inventory, gpus=gpus)


def check_health(
    root: str, inventory: NodeInventory, runner: Runner | None = None
) -> dict[int, str | None]:
    """GPU index -> None when healthy, else a one-line reason.

    Cheap enough for a 5 s period: a few stat()/readlink() calls per GPU and one vendor
    tool run. A GPU is unhealthy when it left the PCI bus, lost its driver binding, or
    the vendor tool reports it unavailable. A vendor tool that is missing or fails is
    not held against the GPUs (the sysfs checks still apply).
    """
    health: dict[int, str | None] = {}
    runner = runner or runner_for(root)
    if inventory.backend == "metax":
        reasons, _ = metax.unavailable_reasons(root, runner)
        tool_ok = bool(reasons)
        drivers = metax.DRIVER_NAMES
    elif inventory.backend == "nvidia":
        reasons, tool_ok = _nvidia_reasons(root, runner)
        drivers = nvidia.DRIVER_NAMES
    else:
        return health
    for gpu in inventory.gpus:
        address = gpu.pci_address
        if not sysfs.device_present(root, address):
            health[gpu.index] = f"PCI device {address} is gone from the bus"
            continue
        driver = sysfs.bound_driver(root, address)
        if driver is None or driver.lower() not in drivers:
            bound = f"bound to {driver!r}" if driver else "not bound to any driver"
            health[gpu.index] = f"PCI device {address} is {bound}, not {inventory.backend}"
            continue
        if tool_ok and address not in reasons:
            health[gpu.index] = f"{address} is not reported by the vendor tool"
            continue
        health[gpu.index] = reasons.get(address)
    return health


def _nvidia_reasons(root: str, runner: Runner | None) -> tuple[dict[str, str | None], bool]:
    tool = find_tool(root, "nvidia-smi", nvidia.NVSMI_CANDIDATES)
    if tool is None:
        return {}, False
    result = run_tool(runner, [tool, "--query-gpu=pci.bus_id", "--format=csv,noheader"])
    reasons: dict[str, str | None] = {}
    for line in result.stdout.splitlines():
        if line.strip():
            try:
                reasons[nvidia.normalise_bus_id(line)] = None
            except ValueError:
                continue
    for address, why in nvidia.unreachable(result.stderr).items():
        reasons[address] = f"nvidia-smi: {why}"
    return reasons, bool(reasons)
