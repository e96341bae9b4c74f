"""``--gpus all | N | [ID1,ID2] | [SN1,SN2]``: which GPUs of the host inventory a container gets.

Forms (SPEC §10): ``all`` every GPU; ``N`` the first N (by index); a bracketed list names
GPUs by id — the index mx-smi shows (``GPU#3``) or the GPU's UUID — or by serial number
(``mx-smi --show-sn``), mixed freely. Only healthy GPUs with device nodes count: a GPU whose
driver is not bound has none, and a GPU the health check (``gpuk8s.discovery.check_health``,
the device plugin's: mx-smi's unavailable reason, the PCI device and its driver binding)
finds unhealthy is never handed out. ``all`` and ``N`` skip such GPUs (an unhealthy one
with a warning), naming one is an error. docker's own
NVIDIA syntax (``device=0,1``, ``count=2``, ``"device=0,1"``) is refused with a hint, and so
is a bare comma list (``0,1``: brackets say "ids", a bare number says "count").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..core.model import Gpu, NodeInventory
from ..core.topology import Unit
from .dockerargs import UsageError

FORMS = "all, a count N, [ID1,ID2] or [SN1,SN2]"


@dataclass(frozen=True)
class GpuRequest:
    every: bool = False
    count: int = 0
    names: tuple[str, ...] = ()  # ids or serial numbers, as given


def parse_request(value: str) -> GpuRequest:
    text = value.strip()
    shown = f"--gpus {value!r}" if not text or " " in value else f"--gpus {value}"
    if not text:
        raise UsageError(f"{shown}: empty; use {FORMS}")
    unquoted = text.strip("'\"")
    if "=" in unquoted:
        raise UsageError(
            f"{shown}: docker's NVIDIA syntax (device=, count=, capabilities=) is not "
            f"metax-docker's; use {FORMS}"
        )
    if text == "all":
        return GpuRequest(every=True)
    if text.isdigit():
        count = int(text)
        if count < 1:
            raise UsageError(f"{shown}: ask for at least one GPU, or leave --gpus out")
        return GpuRequest(count=count)
    if text.startswith("[") and text.endswith("]"):
        names = tuple(n.strip() for n in text[1:-1].split(","))
        if names == ("",):
            raise UsageError(f"{shown}: the list is empty; name GPUs by id or serial number")
        if "" in names:
            raise UsageError(f"{shown}: empty entry in the list")
        return GpuRequest(names=names)
    if "," in text:
        raise UsageError(
            f"{shown}: a list of GPUs goes in brackets, quoted for the shell: --gpus '[{text}]'"
        )
    raise UsageError(f"{shown}: use {FORMS}")


@dataclass(frozen=True)
class Selection:
    gpus: tuple[Gpu, ...]  # host (index) order
    warnings: tuple[str, ...] = ()  # unhealthy GPUs that all / N skipped


def select(
    inventory: NodeInventory,
    request: GpuRequest,
    where: str = "this host",
    health: Mapping[int, str | None] | None = None,
) -> Selection:
    """The requested GPUs; ``UsageError`` names what is wrong. ``health``: GPU index ->
    None when healthy, else why not (``check_health``); a GPU it does not list counts as
    healthy."""
    if inventory.backend != "metax" or not inventory.gpus:
        detail = f" (host has {inventory.backend} GPUs)" if inventory.backend == "nvidia" else ""
        why = f": {inventory.problems[0]}" if inventory.problems else ""
        raise UsageError(f"no MetaX GPU on {where}{detail}{why}")
    health = health or {}
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    with_nodes = [g for g in gpus if g.device_nodes]
    sick = [g for g in with_nodes if health.get(g.index)]
    usable = [g for g in with_nodes if not health.get(g.index)]
    if request.every or request.count:
        if not usable:
            raise UsageError(f"no usable MetaX GPU on {where} ({_unusable(gpus, sick)})")
        if request.count > len(usable):
            have = f"{len(usable)} usable MetaX GPU" + ("s" if len(usable) != 1 else "")
            raise UsageError(f"--gpus {request.count}: {where} has {have} "
                             f"({_unusable(gpus, sick)})")
        chosen = usable if request.every else usable[: request.count]
        last = chosen[-1].index
        skipped = [g for g in sick if g.index < last or request.every]
        warnings = tuple(f"GPU {g.index} ({g.pci_address}) is unhealthy, skipped: "
                         f"{health[g.index]}" for g in skipped)
        return Selection(tuple(chosen), warnings)
    picked: dict[int, Gpu] = {}
    for name in request.names:
        gpu = _find(gpus, name)
        if gpu is None:
            raise UsageError(
                f"--gpus [{','.join(request.names)}]: no GPU {name!r} on {where} "
                f"(ids {_ids(gpus)}; serial numbers {', '.join(_serials(gpus)) or 'unknown'})"
            )
        if gpu.index in picked:
            raise UsageError(f"--gpus [{','.join(request.names)}]: GPU {gpu.index} is named twice")
        if not gpu.device_nodes:
            raise UsageError(
                f"GPU {gpu.index} ({gpu.pci_address}) has no device nodes "
                "(is the metax driver bound to it?)"
            )
        reason = health.get(gpu.index)
        if reason:
            raise UsageError(
                f"GPU {gpu.index} ({gpu.pci_address}) is unhealthy: {reason}; name another "
                f"GPU (healthy: {', '.join(str(g.index) for g in usable) or 'none'})"
            )
        picked[gpu.index] = gpu
    return Selection(tuple(picked[i] for i in sorted(picked)))


def _unusable(gpus: Sequence[Gpu], sick: Sequence[Gpu]) -> str:
    """Which GPUs are left out and why: 'left out: 1 unhealthy: GPU 3; 1 without device
    nodes: GPU 2 (is the metax driver bound?)'."""
    bare = [g for g in gpus if not g.device_nodes]
    parts = [f"{len(left)} {what}: GPU {_ids(left)}"
             for what, left in (("unhealthy", sick), ("without device nodes", bare)) if left]
    hint = " (is the metax driver bound?)" if bare else ""
    return "left out: " + "; ".join(parts) + hint if parts else "none left out"


def units_of(gpus: Sequence[Gpu]) -> list[Unit]:
    """Whole-GPU units, ids as the device plugin names them (the PCI address)."""
    return [Unit(id=g.pci_address, gpu=g.index) for g in gpus]


def _find(gpus: Sequence[Gpu], name: str) -> Gpu | None:
    if name.isdigit():
        for gpu in gpus:
            if gpu.index == int(name):
                return gpu
    for gpu in gpus:
        if name in (gpu.serial, gpu.uuid):
            return gpu
    return None


def _ids(gpus: Sequence[Gpu]) -> str:
    indices = [g.index for g in gpus]
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
        return f"{indices[0]}-{indices[-1]}"
    return ",".join(str(i) for i in indices)


def _serials(gpus: Sequence[Gpu]) -> list[str]:
    return [g.serial for g in gpus if g.serial]
