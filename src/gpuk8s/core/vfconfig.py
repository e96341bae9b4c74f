"""GPU virtualisation config of the operator scheme (SPEC §6): ConfigMap ``driver-config``,
key ``node-vfnums``: ``nodes: {NODE: {vfnum: M}}``. Validation only (pure; the caller
decodes the YAML).

A value is allowed when it is 0 (virtualisation off) or one of 1, 2, 4, 8 up to the
product's SR-IOV limit (``sriov_totalvfs``; SPEC §4 "1, 2, 4 or 8 depending on the
product"). The node agent checks again against the GPU's real ``sriov_totalvfs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ALLOWED_VFNUMS = (0, 1, 2, 4, 8)
# VFs per GPU by product; products without SR-IOV allow only 0. Unknown products: every
# value of ALLOWED_VFNUMS (the node agent's sriov_totalvfs check is then the limit).
MAX_VFS: dict[str, int] = {"C500": 8, "C550": 8, "C588": 8, "C600": 8, "C280": 8, "N260": 0}
VFNUMS_KEY = "node-vfnums"


@dataclass(frozen=True)
class VfProblem:
    node: str | None  # None: the document as a whole
    value: Any
    message: str


def allowed_vfnums(product: str | None, sriov: str | None = None) -> tuple[int, ...]:
    """VF counts allowed on a node of ``product`` whose ``gpu.sriov`` label is ``sriov``."""
    if sriov == "forbidden":
        return (0,)
    limit = MAX_VFS.get((product or "").upper())
    if limit is None:
        return ALLOWED_VFNUMS
    return tuple(v for v in ALLOWED_VFNUMS if v <= limit)


def parse_node_vfnums(data: Any) -> tuple[dict[str, int], list[VfProblem]]:
    """(node -> vfnum, problems) of a decoded ``node-vfnums`` document.

    A document that is not ``{nodes: {...}}`` is one problem and yields nothing; a bad entry
    is a problem naming the node and its value, the other entries still count.
    """
    if data is None:
        return {}, []
    if not isinstance(data, Mapping) or set(data) - {"nodes"}:
        return {}, [VfProblem(None, data, "node-vfnums must be a mapping with the single key "
                                          "'nodes' (e.g. 'nodes: {node-1: {vfnum: 4}}')")]
    nodes = data.get("nodes") or {}
    if not isinstance(nodes, Mapping):
        return {}, [VfProblem(None, nodes, "node-vfnums: 'nodes' must map node names to "
                                           "{vfnum: N}")]
    wanted: dict[str, int] = {}
    problems: list[VfProblem] = []
    for node, entry in nodes.items():
        name = str(node)
        if not isinstance(entry, Mapping) or set(entry) != {"vfnum"}:
            problems.append(VfProblem(name, entry, f"node {name}: expected {{vfnum: N}}, got "
                                                   f"{entry!r}"))
            continue
        value = entry["vfnum"]
        if isinstance(value, bool) or not isinstance(value, int) or value not in ALLOWED_VFNUMS:
            problems.append(VfProblem(name, value, f"node {name}: vfnum {value!r} is not one of "
                                                   f"{', '.join(map(str, ALLOWED_VFNUMS))}"))
            continue
        wanted[name] = value
    return wanted, problems


def check_node(node: str, vfnum: int, product: str | None, sriov: str | None
               ) -> VfProblem | None:
    """A problem when ``vfnum`` is not allowed for the node's product / SR-IOV state."""
    allowed = allowed_vfnums(product, sriov)
    if vfnum in allowed:
        return None
    return VfProblem(node, vfnum, f"node {node}: vfnum {vfnum} is not allowed for "
                                  f"{product or 'this GPU'} (gpu.sriov={sriov or '?'}); allowed: "
                                  f"{', '.join(map(str, allowed))}")
