"""gpuk8s' CDI specs and edits against the reference CDI library
(tags.cncf.io/container-device-interface, built by ``lab/tools.sh cdi`` as
gpuk8s-cdi-check): every spec container-runtime would write for the simulator's presets
is valid for it, and the edits the OCI runtime wrapper applies (``core.cdi.apply_to_oci``)
are the ones the library injects."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.cdi import (
    SdkSource,
    apply_to_oci,
    build_spec,
    driver_edits,
    parse_spec,
    resolve,
)
from gpuk8s.discovery import discover
from gpuk8s.discovery.nvidia import driver_files
from gpuk8s.host.ociwrapper import stat_device

pytestmark = pytest.mark.integration


def node_spec(root: Path, preset: str) -> dict:
    # real char devices: the library stats them (mknod: these tests run as root)
    sim.create(str(root), preset, device_nodes="char")
    inventory = discover(str(root))
    extra = None
    if inventory.backend == "nvidia":  # the driver's files and hooks, as container-runtime
        files = driver_files(str(root), inventory.driver.version or "")
        assert files.libraries and files.links
        extra = driver_edits(files, "/usr/local/gpuk8s/bin/gpuk8s-oci-runtime", str(root))
    return build_spec(inventory, host_prefix=str(root),
                      sdk=SdkSource() if inventory.backend == "metax" else None,
                      annotations={"gpuk8s.io/generated-by": "test"}, extra=extra)


@pytest.mark.parametrize("preset", ["c500-8", "c550-8", "mixed-16", "c500-8-vf4", "n260-2",
                                    "nvidia-8", "a100-8"])
def test_specs_are_valid_for_the_reference_library(
    cdi_check: str, tmp_path: Path, preset: str
) -> None:
    spec = node_spec(tmp_path / "root", preset)
    path = tmp_path / "metax-tech.com-gpu.json"
    path.write_text(json.dumps(spec))
    out = subprocess.run([cdi_check, "validate", str(path)], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    # and the check can fail: a name the CDI spec forbids
    spec["devices"][0]["name"] = "bad name!"
    path.write_text(json.dumps(spec))
    out = subprocess.run([cdi_check, "validate", str(path)], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 1 and "bad name!" in out.stderr


@pytest.mark.parametrize("preset", ["c500-8", "nvidia-8"])
def test_wrapper_edits_equal_the_reference_injection(
    cdi_check: str, tmp_path: Path, preset: str
) -> None:
    spec = node_spec(tmp_path / "root", preset)
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / (spec["kind"].replace("/", "-") + ".json")).write_text(json.dumps(spec))
    names = [f"{spec['kind']}={d['name']}" for d in spec["devices"][2:4]]
    base = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"], "cwd": "/"},
            "root": {"path": "rootfs"}, "mounts": [], "linux": {}}
    out = subprocess.run([cdi_check, "inject", str(specs), *names], input=json.dumps(base),
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)
    ours = apply_to_oci(json.loads(json.dumps(base)),
                        resolve([parse_spec(spec)], names), stat_device)

    def devices(oci: dict) -> set:
        return {(d["path"], d["type"], d["major"], d["minor"]) for d in oci["linux"]["devices"]}

    def rules(oci: dict) -> set:
        return {(r["type"], r["major"], r["minor"], r["access"])
                for r in oci["linux"]["resources"]["devices"] if r.get("allow")}

    # two GPUs: card + renderD each and /dev/mxcd; /dev/nvidiaN each and four control nodes
    assert devices(ours) == devices(theirs)
    assert len(devices(ours)) == {"c500-8": 5, "nvidia-8": 6}[preset]
    assert rules(ours) <= rules(theirs)
    assert {(m["destination"], m["source"], tuple(m["options"])) for m in ours["mounts"]} == \
        {(m["destination"], m["source"], tuple(m["options"])) for m in theirs["mounts"]}
    assert set(ours["process"]["env"]) == set(theirs["process"]["env"])
    assert ours.get("hooks", {}) == theirs.get("hooks", {})
    if preset == "nvidia-8":
        assert [h["args"][2] for h in theirs["hooks"]["createContainer"]] == [
            "create-symlinks", "enable-cuda-compat", "update-ldcache"]
        assert any(m["destination"].endswith("libcuda.so.550.54.15") for m in theirs["mounts"])
