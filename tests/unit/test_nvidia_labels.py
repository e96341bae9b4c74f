"""NVIDIA node labels (SPEC §14, issue 27 items 4 and 5): the accelerator manual's bare
``cuda-major-version`` / ``cuda-minor-version`` beside the prefixed pair, and NVIDIA GPU
Feature Discovery's labels with GFD's value formats, from the same discovery (nvidia-smi,
NVML) of a simulated node; gpu-label adds, changes and removes them like its other labels."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.cuda import BARE_MAJOR_LABEL, BARE_MINOR_LABEL, MAJOR_LABEL, MINOR_LABEL
from gpuk8s.core.labels import (
    GFD_LABELS,
    compute_labels,
    gfd_family,
    gfd_gpu_mode,
    gfd_machine,
    gfd_product,
    label_diff,
    owned_labels,
)
from gpuk8s.core.sharing import SHARING_MODE_LABEL
from gpuk8s.discovery import discover, nvidia
from gpuk8s.services.labeller.main import make_pass
from gpuk8s.sim import tree

from .test_labeller import LabelStore

pytestmark = pytest.mark.usefixtures("fast_python3")

H100_GFD = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "54",
    "nvidia.com/cuda.driver.rev": "15",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "54",
    "nvidia.com/cuda.driver-version.revision": "15",
    "nvidia.com/cuda.driver-version.full": "550.54.15",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4",
    "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "none",
    "nvidia.com/gpu.machine": "unknown",
    "nvidia.com/gpu.mode": "compute",
    "nvidia.com/gpu.present": "true",
}

# GFD's documented labels (k8s-device-plugin README, "Generated Labels", and the GPU
# Operator's gpu.present) and the value format each one has there, written out by hand:
# Integer, Boolean, String (a label value) or one of the listed values.
INTEGER, BOOLEAN, STRING = r"\d+", r"true|false", r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
GFD_DOCUMENTED = {
    "nvidia.com/cuda.driver.major": INTEGER,
    "nvidia.com/cuda.driver.minor": INTEGER,
    "nvidia.com/cuda.driver.rev": r"\d*",  # empty for a two-part driver version
    "nvidia.com/cuda.runtime.major": INTEGER,
    "nvidia.com/cuda.runtime.minor": INTEGER,
    "nvidia.com/cuda.driver-version.major": INTEGER,
    "nvidia.com/cuda.driver-version.minor": INTEGER,
    "nvidia.com/cuda.driver-version.revision": r"\d*",
    "nvidia.com/cuda.driver-version.full": r"\d+\.\d+(\.\d+)?",
    "nvidia.com/cuda.runtime-version.major": INTEGER,
    "nvidia.com/cuda.runtime-version.minor": INTEGER,
    "nvidia.com/cuda.runtime-version.full": r"\d+\.\d+",
    "nvidia.com/gpu.compute.major": INTEGER,
    "nvidia.com/gpu.compute.minor": INTEGER,
    "nvidia.com/gpu.count": INTEGER,
    "nvidia.com/gpu.family": r"tesla|fermi|kepler|maxwell|pascal|volta|turing|ampere|"
                             r"ada-lovelace|hopper|blackwell|undefined",
    "nvidia.com/gpu.machine": STRING,
    "nvidia.com/gpu.memory": INTEGER,  # MiB
    "nvidia.com/gpu.mode": r"compute|graphics|unknown",
    "nvidia.com/gpu.product": STRING,
    "nvidia.com/gpu.replicas": INTEGER,
    "nvidia.com/gpu.sharing-strategy": r"none|mps|time-slicing",
    "nvidia.com/mig.capable": BOOLEAN,
    "nvidia.com/mig.strategy": r"none|single|mixed",
    "nvidia.com/mps.capable": BOOLEAN,
    "nvidia.com/gpu.present": BOOLEAN,
}
# What GFD writes on the simulated nodes, per GFD's rules, for whole GPUs (the chart's
# default): model, memory MiB, capability and family from NVML; MIG on A100/H100, not
# on T4 (MIG strategy none: no MIG devices); replicas 1, strategy none; the machine from
# DMI; the mode from the PCI class (all three are 3D controllers, 0x030200: compute).
# Sharing modes change four of them (below).
GFD_TABLE = {
    "nvidia-8": {"gpu.product": "NVIDIA-H100-80GB-HBM3", "gpu.count": "8",
                 "gpu.memory": "81559", "gpu.family": "hopper", "gpu.compute.major": "9",
                 "gpu.compute.minor": "0", "mig.capable": "true", "mig.strategy": "none",
                 "cuda.driver-version.full": "550.54.15",
                 "cuda.runtime-version.full": "12.4", "gpu.mode": "compute"},
    "a100-8": {"gpu.product": "NVIDIA-A100-SXM4-80GB", "gpu.count": "8",
               "gpu.memory": "81920", "gpu.family": "ampere", "gpu.compute.major": "8",
               "gpu.compute.minor": "0", "mig.capable": "true", "mig.strategy": "none",
               "cuda.driver-version.full": "535.183.01",
               "cuda.runtime-version.full": "12.2", "gpu.mode": "compute"},
    "t4-2": {"gpu.product": "Tesla-T4", "gpu.count": "2", "gpu.memory": "15360",
             "gpu.family": "turing", "gpu.compute.major": "7", "gpu.compute.minor": "5",
             "mig.capable": "false", "cuda.driver-version.full": "515.65.01",
             "cuda.runtime-version.full": "11.7", "gpu.mode": "compute"},
}
# per sharing mode: strategy, replicas (device ids per GPU gpu-device serves), MPS
# capable, and GFD's "-SHARED" after a replicated product
GFD_SHARING_TABLE = {
    "exclusive": ("none", "1", "false", ""),
    "mps": ("mps", "100", "true", "-SHARED"),
    "vcuda": ("time-slicing", "100", "false", "-SHARED"),
}


def set_driver_cuda(root: str, version: str | None) -> None:
    state = sim.state(root)
    state["driver"]["cuda"] = version
    tree.save_state(root, state)


def test_nvidia_nodes_carry_the_bare_cuda_keys_and_gfds_labels(nvidia_sim_root: str) -> None:
    labels = compute_labels(discover(nvidia_sim_root))
    assert labels[BARE_MAJOR_LABEL] == labels[MAJOR_LABEL] == "12"
    assert labels[BARE_MINOR_LABEL] == labels[MINOR_LABEL] == "4"
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/")} == H100_GFD
    # the SPEC §4 set stays as it was
    assert labels["metax-tech.com/gpu.product"] == "H100"
    assert labels["metax-tech.com/gpu.family"] == "NVIDIA-Hopper"


@pytest.mark.parametrize(("preset", "name", "capability", "family", "memory", "cuda"), [
    ("nvidia-8", "NVIDIA-H100-80GB-HBM3", (9, 0), "hopper", "81559", ("12", "4")),
    ("a100-8", "NVIDIA-A100-SXM4-80GB", (8, 0), "ampere", "81920", ("12", "2")),
    ("v100-8", "Tesla-V100-SXM2-32GB", (7, 0), "volta", "32768", ("12", "2")),
    ("t4-2", "Tesla-T4", (7, 5), "turing", "15360", ("11", "7")),
    ("p100-4", "Tesla-P100-PCIE-16GB", (6, 0), "pascal", "16384", ("11", "4")),
])
def test_each_preset_reports_its_own_compute_capability(
    tmp_path: Path, preset: str, name: str, capability: tuple[int, int], family: str,
    memory: str, cuda: tuple[str, str],
) -> None:
    root = str(tmp_path / preset)
    sim.create(root, preset)
    inventory = discover(root)
    assert {g.compute_capability for g in inventory.gpus} == {capability}
    # nvidia-smi says the same as NVML (each GPU's compute_cap)
    out = nvidia.run_tool(None, [f"{root}/usr/bin/nvidia-smi",
                                 "--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader"])
    assert set(nvidia.parse_compute_caps(out.stdout).values()) == {capability}
    labels = compute_labels(inventory)
    assert labels["nvidia.com/gpu.product"] == name
    assert labels["nvidia.com/gpu.family"] == family
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == \
        tuple(str(n) for n in capability)
    assert labels["nvidia.com/gpu.memory"] == memory
    assert (labels[BARE_MAJOR_LABEL], labels[BARE_MINOR_LABEL]) == cuda


def test_compute_capability_falls_back_to_nvidia_smi_when_nvml_cannot_say(
    nvidia_sim_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an NVML without nvmlDeviceGetCudaComputeCapability: nvidia-smi's compute_cap answers
    monkeypatch.setattr(nvidia, "nvml_info",
                        lambda root, addresses=(), nvlink=False: nvidia.NvmlInfo(cuda=None,
                                                                                 compute={}))
    inventory = discover(nvidia_sim_root)
    assert {g.compute_capability for g in inventory.gpus} == {(9, 0)}


def test_nvidia_smi_compute_cap_parsing() -> None:
    text = "00000000:18:00.0, 9.0\n00000000:2A:00.0, 8.6\nbad line\n00000000:3A:00.0, [N/A]\n"
    assert nvidia.parse_compute_caps(text) == {"0000:18:00.0": (9, 0), "0000:2a:00.0": (8, 6)}


def test_gfd_value_formats() -> None:
    assert gfd_product("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert gfd_product("Tesla V100-SXM2-32GB") == "Tesla-V100-SXM2-32GB"
    assert gfd_product("NVIDIA  GeForce RTX 4090 (rev. a)") == "NVIDIA-GeForce-RTX-4090-rev.-a"
    table = {(6, 0): "pascal", (7, 0): "volta", (7, 5): "turing", (8, 0): "ampere",
             (8, 6): "ampere", (8, 9): "ada-lovelace", (9, 0): "hopper", (10, 0): "blackwell",
             (12, 0): "blackwell", (4, 0): "undefined"}
    assert {cc: gfd_family(*cc) for cc in table} == table


@pytest.mark.parametrize("preset", sorted(GFD_TABLE))
@pytest.mark.parametrize("mode", sorted(GFD_SHARING_TABLE))
def test_gfd_parity_with_the_documented_labels(tmp_path: Path, preset: str, mode: str) -> None:
    root = str(tmp_path / preset)
    sim.create(root, preset)
    os.makedirs(f"{root}/sys/class/dmi/id", exist_ok=True)
    with open(f"{root}/sys/class/dmi/id/product_name", "w", encoding="utf-8") as f:
        f.write("DGX H100 \n" if preset == "nvidia-8" else "PowerEdge R750xa\n")
    store = LabelStore({"n": {SHARING_MODE_LABEL: mode}})
    make_pass(store, "n", root, discover, sharing=True)()
    labels = {k: v for k, v in store.labels["n"].items() if k.startswith("nvidia.com/")}
    # every documented label GFD writes on this hardware, nothing else, in GFD's formats
    expected_keys = set(GFD_DOCUMENTED) - (set() if preset != "t4-2" else
                                           {"nvidia.com/mig.strategy"})
    assert set(labels) == expected_keys
    for key, value in labels.items():
        assert re.fullmatch(GFD_DOCUMENTED[key], value), (key, value)
    strategy, replicas, mps, suffix = GFD_SHARING_TABLE[mode]
    wanted = {**GFD_TABLE[preset], "gpu.sharing-strategy": strategy, "gpu.replicas": replicas,
              "mps.capable": mps, "gpu.present": "true",
              "gpu.machine": "DGX-H100" if preset == "nvidia-8" else "PowerEdge-R750xa"}
    wanted["gpu.product"] += suffix
    assert {k: labels[f"nvidia.com/{k}"] for k in wanted} == wanted
    # without the chart's sharing, gpu-device serves whole GPUs whatever the node's label
    whole = LabelStore({"n": {SHARING_MODE_LABEL: mode}})
    make_pass(whole, "n", root, discover)()
    assert whole.labels["n"]["nvidia.com/gpu.sharing-strategy"] == "none"
    assert whole.labels["n"]["nvidia.com/gpu.product"] == GFD_TABLE[preset]["gpu.product"]


def test_gfd_sharing_labels_follow_the_node_label_and_skip_unknown_modes(
    nvidia_sim_root: str,
) -> None:
    store = LabelStore({"n": {}})
    one_pass = make_pass(store, "n", nvidia_sim_root, discover, sharing=True)
    one_pass()
    assert store.labels["n"]["nvidia.com/gpu.sharing-strategy"] == "none"
    store.labels["n"][SHARING_MODE_LABEL] = "mps"
    result = one_pass()
    assert result.changes["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert store.labels["n"]["nvidia.com/mps.capable"] == "true"
    # a mode with no GFD strategy (MetaX sGPU): GFD's sharing labels are not guessed
    store.labels["n"][SHARING_MODE_LABEL] = "sgpu"
    one_pass()
    labels = store.labels["n"]
    assert not {"nvidia.com/gpu.sharing-strategy", "nvidia.com/gpu.replicas",
                "nvidia.com/mps.capable"} & set(labels)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_gfd_machine_type() -> None:
    assert gfd_machine("DGX H100\n") == "DGX-H100"
    assert gfd_machine("  ") == gfd_machine(None) == "unknown"
    # GFD only turns blanks into '-'; characters no label value may hold become '-' too
    assert gfd_machine("Standard_ND96isr (H100) v5") == "Standard_ND96isr--H100--v5"


def test_gfd_gpu_mode_from_the_pci_class(tmp_path: Path) -> None:
    """GFD's gpu.mode: a 3D controller computes, a VGA controller is a graphics GPU, any
    other class is unknown; read from each GPU's sysfs ``class`` file, the first GPU's
    class on a node of mixed modes (GFD keeps the first)."""
    assert gfd_gpu_mode([0x030200]) == "compute"
    assert gfd_gpu_mode([0x030000]) == "graphics"
    assert gfd_gpu_mode([0x038000]) == gfd_gpu_mode([None]) == gfd_gpu_mode([]) == "unknown"
    assert gfd_gpu_mode([0x030000, 0x030200]) == "graphics"
    assert gfd_gpu_mode([0x030200, 0x030000, 0x030000]) == "compute"
    root = str(tmp_path / "t4")
    sim.create(root, "t4-2")
    first, second = sorted(discover(root).gpus, key=lambda g: g.index)
    assert (first.pci_class, second.pci_class) == (0x030200, 0x030200)

    def set_class(address: str, code: str) -> None:
        with open(f"{root}/sys/bus/pci/devices/{address}/class", "w", encoding="utf-8") as f:
            f.write(code + "\n")

    store = LabelStore({"n": {}})
    one_pass = make_pass(store, "n", root, discover)
    one_pass()
    assert store.labels["n"]["nvidia.com/gpu.mode"] == "compute"
    set_class(second.pci_address, "0x030000")  # the second GPU in VGA mode: the first's
    assert one_pass().changes == {}
    set_class(first.pci_address, "0x030000")  # both: graphics, and the label follows
    assert one_pass().changes == {"nvidia.com/gpu.mode": "graphics"}
    assert [g.pci_class for g in discover(root).gpus] == [0x030000, 0x030000]
    assert discover(root).to_dict()["gpus"][0]["pci_class"] == "0x030000"


def test_two_part_driver_version_has_an_empty_rev(nvidia_sim_root: str) -> None:
    inventory = discover(nvidia_sim_root)
    two = replace(inventory, driver=replace(inventory.driver, version="560.28"))
    labels = compute_labels(two)
    assert labels["nvidia.com/cuda.driver.minor"] == "28"
    assert labels["nvidia.com/cuda.driver.rev"] == ""
    assert labels["nvidia.com/cuda.driver-version.full"] == "560.28"


def test_no_gfd_or_cuda_labels_without_a_loaded_nvidia_driver(tmp_path: Path) -> None:
    root = str(tmp_path / "n")
    sim.create(root, "nvidia-8-nodriver")
    labels = compute_labels(discover(root))
    assert labels["metax-tech.com/gpu.installed"] == "true"
    assert not any(k.startswith("nvidia.com/") or "cuda" in k for k in labels)


def test_ownership_of_the_keys_outside_the_prefix(
    nvidia_sim_root: str, tmp_path: Path
) -> None:
    nv = discover(nvidia_sim_root)
    mx_root = str(tmp_path / "mx")
    sim.create(mx_root, "c500-8")
    mx = discover(mx_root)
    assert set(GFD_LABELS) <= set(owned_labels(mx))
    assert BARE_MAJOR_LABEL in owned_labels(nv) and BARE_MAJOR_LABEL not in owned_labels(mx)
    others = {"nvidia.com/gpu-driver-upgrade-state": "x", "example.com/team": "ml"}
    # a MetaX node: the administrator's hand-set CUDA labels (manual 002-07) stay; a stale
    # GFD label gpu-label once wrote goes; NVIDIA's other labels are not ours
    current = {**compute_labels(mx), BARE_MAJOR_LABEL: "12", BARE_MINOR_LABEL: "4",
               "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", **others}
    assert label_diff(current, compute_labels(mx), owned=owned_labels(mx)) == {
        "nvidia.com/gpu.product": None}
    # an NVIDIA node: a wrong hand-set value is corrected
    current = {**compute_labels(nv), BARE_MINOR_LABEL: "9", **others}
    assert label_diff(current, compute_labels(nv), owned=owned_labels(nv)) == {
        BARE_MINOR_LABEL: "4"}
    # without saying it owns them, nothing outside the prefix may be written
    with pytest.raises(ValueError, match="cuda-major-version"):
        label_diff({}, compute_labels(nv))


def test_the_labeller_writes_and_cleans_them(nvidia_sim_root: str) -> None:
    store = LabelStore({"gpu-1": {"example.com/team": "ml", "nvidia.com/gpu.present": "true"}})
    one_pass = make_pass(store, "gpu-1", nvidia_sim_root, discover)
    one_pass()
    labels = store.labels["gpu-1"]
    assert (labels[BARE_MAJOR_LABEL], labels[BARE_MINOR_LABEL]) == ("12", "4")
    assert {k: v for k, v in labels.items() if k in GFD_LABELS} == H100_GFD
    try:
        set_driver_cuda(nvidia_sim_root, "12.2")  # another driver: the labels follow
        one_pass()
        assert labels[BARE_MINOR_LABEL] == "2" == labels["nvidia.com/cuda.runtime.minor"]
        set_driver_cuda(nvidia_sim_root, None)  # NVML cannot say: the CUDA labels go
        result = one_pass()
        assert BARE_MAJOR_LABEL not in labels and MAJOR_LABEL not in labels
        assert "nvidia.com/cuda.runtime.major" not in labels
        assert result.changes[BARE_MAJOR_LABEL] is None
    finally:
        set_driver_cuda(nvidia_sim_root, "12.4")
    # labels that are not gpu-label's are never touched
    assert labels["example.com/team"] == "ml" and labels["nvidia.com/gpu.present"] == "true"


def test_the_ansible_module_agrees_with_gpu_label(tmp_path: Path) -> None:
    """playbooks/verify.yml compares gpu_labels' answer with the node: it reads the same
    machine type and follows the node's sharing mode, so a node gpu-label wrote in MPS
    mode needs no update."""
    from gpuk8s.ansible.harness import run_module

    root = str(tmp_path / "h100")
    sim.create(root, "nvidia-8")
    os.makedirs(f"{root}/sys/class/dmi/id", exist_ok=True)
    with open(f"{root}/sys/class/dmi/id/product_name", "w", encoding="utf-8") as f:
        f.write("DGX H100\n")
    store = LabelStore({"n": {SHARING_MODE_LABEL: "mps"}})
    make_pass(store, "n", root, discover, sharing=True)()
    node = store.labels["n"]
    assert node["nvidia.com/gpu.machine"] == "DGX-H100"
    result = run_module("gpu_labels", {"host_root": root, "current_labels": node},
                        check_mode=True)
    assert result["patch"] == {} and not result["needs_update"], result["patch"]
    assert result["labels"]["nvidia.com/gpu.sharing-strategy"] == "mps"
