"""core.cdi: the one computation of device + SDK edits, and its four renderings."""

from __future__ import annotations

import copy
import json

import pytest

from gpuk8s import sim
from gpuk8s.core import cdi
from gpuk8s.core.topology import units_for_inventory
from gpuk8s.discovery import discover


@pytest.fixture(scope="module")
def c500(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("c500")
    sim.create(str(root), "c500-8")
    return str(root)


@pytest.fixture(scope="module")
def vf4(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("vf4")
    sim.create(str(root), "c500-8-vf4")
    return str(root)


def test_spec_has_one_device_per_unit_plus_all_and_common_edits(c500: str) -> None:
    inv = discover(c500)
    spec = cdi.build_spec(inv, host_prefix="/sim", sdk=cdi.SdkSource())
    assert spec["cdiVersion"] == cdi.CDI_VERSION
    assert spec["kind"] == "metax-tech.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == [g.pci_address for g in inv.gpus] + ["all"]
    first = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in first] == list(inv.gpus[0].device_nodes)
    assert all(n["hostPath"] == "/sim" + n["path"] for n in first)
    common = spec["containerEdits"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/mxcd"]
    assert {m["containerPath"]: m["hostPath"] for m in common["mounts"]} == {
        "/opt/maca": "/sim/opt/maca",
        "/opt/mxdriver": "/sim/opt/mxdriver",
    }
    assert all("ro" in m["options"] for m in common["mounts"])
    assert "MACA_PATH=/opt/maca" in common["env"]
    assert "LD_LIBRARY_PATH=/opt/maca/lib:/opt/mxdriver/lib" in common["env"]
    all_nodes = spec["devices"][-1]["containerEdits"]["deviceNodes"]
    assert len(all_nodes) == sum(len(g.device_nodes) for g in inv.gpus)


def test_vf_spec_names_each_vf(vf4: str) -> None:
    inv = discover(vf4)
    spec = cdi.build_spec(inv)
    assert len(spec["devices"]) == 32 + 1
    vf_nodes = spec["devices"][2]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in vf_nodes] == list(inv.gpus[0].sriov.vf_device_nodes[2])


def test_spec_round_trips_through_the_strict_parser(c500: str) -> None:
    inv = discover(c500)
    raw = json.loads(json.dumps(cdi.build_spec(inv, sdk=cdi.SdkSource())))
    parsed = cdi.parse_spec(raw)
    unit = units_for_inventory(inv)[3]
    edits = cdi.resolve([parsed], [cdi.qualified("metax-tech.com/gpu", unit.id)])
    direct = cdi.edits_for_units(inv, [unit], sdk=cdi.SdkSource())
    assert edits == direct


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.update(extra=1), "unknown field"),
        (lambda s: s.update(kind="gpu"), "vendor/class"),
        (lambda s: s.update(cdiVersion="9.9.9"), "cdiVersion"),
        (lambda s: s["devices"][0].update(name="-bad"), "device name"),
        (lambda s: s["devices"].append(copy.deepcopy(s["devices"][0])), "defined twice"),
        (lambda s: s["containerEdits"].update(env=["no equals"]), "NAME=value"),
        (lambda s: s["containerEdits"]["deviceNodes"][0].update(path="dev/x"), "absolute"),
        (lambda s: s["containerEdits"].update(hooks=[{"hookName": "x", "path": "/x"}]), "hooks"),
    ],
)
def test_parser_rejects_with_a_message_naming_the_field(c500: str, mutate, message: str) -> None:
    raw = cdi.build_spec(discover(c500), sdk=cdi.SdkSource())
    mutate(raw)
    with pytest.raises(cdi.CdiError, match=message):
        cdi.parse_spec(raw)


def test_resolve_rejects_unknown_devices_and_bare_names(c500: str) -> None:
    parsed = cdi.parse_spec(cdi.build_spec(discover(c500)))
    with pytest.raises(cdi.CdiError, match="unresolvable"):
        cdi.resolve([parsed], ["metax-tech.com/gpu=0000:ff:00.0"])
    with pytest.raises(cdi.CdiError, match="fully qualified"):
        cdi.resolve([parsed], ["0000:03:00.0"])


def fake_stat(path: str) -> tuple[str, int, int]:
    return ("c", 226, sum(map(ord, path)) % 256)


def test_apply_to_oci_adds_devices_rules_mounts_env_once(c500: str) -> None:
    inv = discover(c500)
    units = units_for_inventory(inv)[:2]
    edits = cdi.edits_for_units(inv, units, sdk=cdi.SdkSource())
    config = {
        "process": {"env": ["PATH=/usr/bin", "MACA_PATH=/elsewhere"]},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}},
    }
    out = cdi.apply_to_oci(config, edits, fake_stat)
    paths = [d["path"] for d in out["linux"]["devices"]]
    assert paths == ["/dev/mxcd", *inv.gpus[0].device_nodes, *inv.gpus[1].device_nodes]
    rules = out["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}  # the deny-all stays first
    assert len(rules) == 1 + len(paths) and all(r["allow"] for r in rules[1:])
    assert out["process"]["env"].count("MACA_PATH=/opt/maca") == 1
    assert not any(e == "MACA_PATH=/elsewhere" for e in out["process"]["env"])
    assert [m["destination"] for m in out["mounts"]] == ["/proc", "/opt/maca", "/opt/mxdriver"]
    again = cdi.apply_to_oci(copy.deepcopy(out), edits, fake_stat)
    assert again == out  # idempotent: a wrapper called twice changes nothing more


def test_image_sdk_wins_unless_forced(c500: str) -> None:
    inv = discover(c500)
    edits = cdi.edits_for_units(inv, units_for_inventory(inv)[:1], sdk=cdi.SdkSource())
    kept = edits.without_paths(["/opt/maca"])
    assert [m.container_path for m in kept.mounts] == ["/opt/mxdriver"]
    assert not any(e.startswith(("MACA_PATH=", "LD_LIBRARY_PATH=")) for e in kept.env)
    assert kept.device_nodes == edits.device_nodes


def test_docker_args(c500: str) -> None:
    inv = discover(c500)
    edits = cdi.edits_for_units(inv, units_for_inventory(inv)[:1], "/sim", cdi.SdkSource())
    args = cdi.docker_args(edits)
    assert args[:2] == ["--device", "/sim/dev/mxcd:/dev/mxcd:rw"]
    assert "type=bind,source=/sim/opt/maca,target=/opt/maca,readonly" in args
    assert args[-2:] == ["--env", "LD_LIBRARY_PATH=/opt/maca/lib:/opt/mxdriver/lib"]


def test_docker_args_quote_mount_fields_docker_reads_as_csv() -> None:
    import csv

    edits = cdi.ContainerEdits(mounts=(cdi.Mount('/srv/sdk,v2 "new"', "/opt/maca"),))
    args = cdi.docker_args(edits)
    assert args[0] == "--mount"
    # docker parses --mount with encoding/csv: the source must come back whole
    fields = next(csv.reader([args[1]]))
    assert fields == ["type=bind", 'source=/srv/sdk,v2 "new"', "target=/opt/maca", "readonly"]


def test_annotation_devices() -> None:
    got = cdi.annotation_devices(
        {"cdi.k8s.io/gpuk8s": "a.com/b=1, a.com/b=2", "other": "x", "cdi.k8s.io/z": "a.com/b=1"}
    )
    assert got == ["a.com/b=1", "a.com/b=2"]

