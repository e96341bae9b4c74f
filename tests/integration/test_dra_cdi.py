"""The CDI specs gpu-dra writes for prepared claims, against the reference CDI library
(tags.cncf.io/container-device-interface, ``lab/tools.sh cdi``: the library containerd 2.x
injects CDI devices with): every claim's spec is valid, two claims' specs of one kind live
side by side in one directory, and injecting one claim's ids gives the container that
claim's device nodes and environment, the same as ``core.cdi.resolve`` computes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.cdi import parse_spec, resolve
from gpuk8s.core.dra import DRIVER, PoolOptions, gpu_device_name, group_device_name
from gpuk8s.core.model import NodeInventory
from gpuk8s.discovery import discover
from gpuk8s.services.dra.driver import Driver
from gpuk8s.services.dra.grpcapi import ClaimRef
from gpuk8s.services.dra.state import Checkpoint
from gpuk8s.services.node.devices import AllocateOptions, DeviceSet

pytestmark = pytest.mark.integration


class Claims:
    def __init__(self, claims: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.claims = claims

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.claims[(namespace, name)]


def allocated(uid: str, devices: list[str], **extra: Any) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": DRIVER, "pool": "n1", "device": d, **extra}
        for d in devices]}}}}


def device_name(inventory: NodeInventory, device: tuple[Any, ...]) -> str:
    if device[0] == "group":
        return group_device_name([inventory.gpu(i) for i in device[1:]])
    return gpu_device_name(inventory.gpu(device[0]), device[2] if len(device) > 1 else None)


@pytest.mark.parametrize(("preset", "sharing", "wanted"), [
    ("c500-8", "exclusive", {"a": [(1,), (2,)], "b": [("group", 4, 5, 6, 7)]}),
    ("c500-8-vf4", "exclusive", {"a": [(0, "vf", 1), (3, "vf", 0)], "b": [(7, "vf", 3)]}),
    ("c500-8", "sgpu", {"a": [(2,)], "b": [(2,)]}),
    ("nvidia-8", "exclusive", {"a": [(0,)], "b": [(6,), (7,)]}),
], ids=["gpus-and-group", "vfs", "sgpu-shares", "nvidia"])  # fmt: skip
def test_claim_specs_are_injected_by_the_reference_library(
    cdi_check: str, tmp_path: Path, preset: str, sharing: str,
    wanted: dict[str, list[tuple[Any, ...]]],
) -> None:
    root = tmp_path / "root"
    sim.create(str(root), preset, device_nodes="char")  # the library stats device nodes
    inventory = discover(str(root))
    claims = {name: [device_name(inventory, d) for d in found] for name, found in wanted.items()}
    devices = DeviceSet(inventory, DRIVER, AllocateOptions(device_path_prefix=str(root)))
    extra: dict[str, Any] = {}
    if sharing == "sgpu":
        extra = {"consumedCapacity": {"vcore": "40", "vmemory": "4Gi", "shares": "1"}}
    source = Claims({("ns", name): allocated(f"uid-{name}", found,
                                             **({"shareID": f"s-{name}"} if extra else {}),
                                             **extra)
                     for name, found in claims.items()})
    cdi_dir = tmp_path / "cdi"
    driver = Driver(devices, PoolOptions(sharing=sharing), "n1", source,
                    Checkpoint(str(tmp_path / "plugin")), str(cdi_dir))
    ids: dict[str, list[str]] = {}
    for name in claims:
        [result] = driver.prepare([ClaimRef("ns", f"uid-{name}", name)]).values()
        assert result.error == ""
        ids[name] = [i for d in result.devices for i in d.cdi_ids]
    files = sorted(str(p) for p in cdi_dir.iterdir())
    assert len(files) == len(claims)
    out = subprocess.run([cdi_check, "validate", *files], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    specs = [parse_spec(json.loads(Path(f).read_text()), f) for f in files]
    base = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"], "cwd": "/"},
            "root": {"path": "rootfs"}, "mounts": [], "linux": {}}
    for name in claims:
        out = subprocess.run([cdi_check, "inject", str(cdi_dir), *ids[name]],
                             input=json.dumps(base), capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        theirs = json.loads(out.stdout)
        ours = resolve(specs, ids[name])
        assert {d["path"] for d in theirs["linux"]["devices"]} == \
            {n.path for n in ours.device_nodes}
        env = dict(e.split("=", 1) for e in theirs["process"]["env"])
        assert {k: env[k] for k in ours.env_map()} == ours.env_map()
        assert env["GPUK8S_DEVICE_IDS"] == ours.env_map()["GPUK8S_DEVICE_IDS"]
        if sharing == "sgpu":
            assert (env["METAX_SGPU_COMPUTE"], env["METAX_SGPU_MEMORY_MIB"]) == ("40", "4096")
