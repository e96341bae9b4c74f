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
from gpuk8s.core.cdi import SdkSource, apply_to_oci, build_spec, parse_spec, resolve
from gpuk8s.discovery import discover
from gpuk8s.host.ociwrapper import stat_device

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cdi_check() -> str:
    out = subprocess.run([str(REPO / "lab" / "tools.sh"), "cdi"], capture_output=True,
                         text=True, timeout=900, check=True)
    return out.stdout.strip()


def node_spec(root: Path, preset: str) -> dict:
    # real char devices: the library stats them (mknod: these tests run as root)
    sim.create(str(root), preset, device_nodes="char")
    inventory = discover(str(root))
    return build_spec(inventory, host_prefix=str(root), sdk=SdkSource(),
                      annotations={"gpuk8s.io/generated-by": "test"})


@pytest.mark.parametrize("preset", ["c500-8", "c550-8", "mixed-16", "c500-8-vf4", "n260-2"])
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


def test_wrapper_edits_equal_the_reference_injection(cdi_check: str, tmp_path: Path) -> None:
    spec = node_spec(tmp_path / "root", "c500-8")
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "metax-tech.com-gpu.json").write_text(json.dumps(spec))
    names = [f"metax-tech.com/gpu={d['name']}" for d in spec["devices"][2:4]]
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

    assert devices(ours) == devices(theirs) and len(devices(ours)) == 5
    assert rules(ours) <= rules(theirs)
    assert {(m["destination"], m["source"]) for m in ours["mounts"]} == \
        {(m["destination"], m["source"]) for m in theirs["mounts"]}
    assert set(ours["process"]["env"]) == set(theirs["process"]["env"])
