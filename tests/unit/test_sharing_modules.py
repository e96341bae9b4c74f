"""core/sharing is a package of modules by concern; each module's worked example holds,
each imports only the modules above it in the package map, and the package still
names everything its importers use."""

from __future__ import annotations

import ast
from pathlib import Path

import gpuk8s.core.sharing as sharing
from gpuk8s.core.sharing import (
    COUNTED_RESOURCE,
    FAMILY_BY_MODE,
    NO_ROOM,
    Assignment,
    GpuCapacity,
    GpuUsage,
    ShareMix,
    ShareRequest,
    choose_shared,
    fits,
    node_fragmentation,
    parse_assignment,
    parse_share,
    share_env,
    share_mounts,
)

PACKAGE = Path(sharing.__file__).parent
# the order of the package map: a module may import only those before it
ORDER = ["names", "request", "capacity", "packing", "choice", "annotation", "container"]


def test_each_module_imports_only_those_above_it() -> None:
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted([*ORDER, "__init__"])
    for at, name in enumerate(ORDER):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        siblings = {node.module for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
        assert siblings <= set(ORDER[:at]), f"{name} imports {siblings - set(ORDER[:at])}"


def _defined(tree: ast.Module) -> set[str]:
    """Public names a module defines at top level (not the ones it imports)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return {n for n in out if not n.startswith("_")}


def test_the_package_names_every_public_name_of_its_modules() -> None:
    defined: dict[str, str] = {}
    for name in ORDER:
        for n in _defined(ast.parse((PACKAGE / f"{name}.py").read_text())):
            assert n not in defined, f"{n} is defined in {defined[n]} and in {name}"
            defined[n] = name
    assert set(sharing.__all__) == set(defined)
    for n, name in defined.items():
        assert getattr(sharing, n) is getattr(getattr(sharing, name), n)


def test_names_example() -> None:
    assert FAMILY_BY_MODE["mps"].core == "nvidia.com/mps-core"
    assert COUNTED_RESOURCE["sgpu"] == "metax-tech.com/sgpu"


def test_request_example() -> None:
    assert parse_share({"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "16"}) == \
        ShareRequest("vcuda", gpus=1, core=50, memory_mib=4096)
    two = parse_share({"tencent.com/vcuda-core": "200"})
    assert two is not None and two.whole and two.gpus == 2


def test_capacity_example() -> None:
    used = GpuUsage()
    used.add(ShareRequest("vcuda", 1, 60, 0))
    gpu = GpuCapacity(0, 64 * 1024)
    assert fits(gpu, used, ShareRequest("vcuda", 1, 50, 0)) == \
        "40 percent compute left, the pod needs 50 percent"
    assert fits(gpu, used, ShareRequest("vcuda", 1, 40, 0)) is None


def test_packing_example() -> None:
    assert node_fragmentation([100, 30], NO_ROOM, ShareMix({(1, 50, 0, 0): 1.0})) == 30.0


def test_choice_example() -> None:
    used50 = GpuUsage()
    used50.add(ShareRequest("vcuda", 1, 50, 0))
    caps = [GpuCapacity(0, 64 * 1024), GpuCapacity(1, 64 * 1024)]
    assert choose_shared(caps, {1: used50}, ShareRequest("vcuda", 1, 30, 0)).gpus == [1]


def test_annotation_example() -> None:
    raw = ('{"container":"main","core":50,"gpus":[5],"memoryMiB":0,"mode":"sgpu",'
           '"node":"n1","whole":false}')
    got = parse_assignment(raw)
    assert got == Assignment("n1", (5,), ShareRequest("sgpu", 1, 50, 0, container="main"))
    assert got.to_json() == raw


def test_container_example() -> None:
    mps = Assignment("n1", (0,), ShareRequest("mps", 1, 30, 4096, container="main"))
    assert share_env(mps, ["GPU-1"]) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpuk8s/mps/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
    }
    assert share_mounts(mps, ["GPU-1"]) == [("/run/gpuk8s/mps/GPU-1/pipe", "/run/gpuk8s/mps/pipe")]
