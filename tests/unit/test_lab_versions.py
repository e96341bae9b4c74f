"""lab/versions.py and lab/versions.sh: the Kubernetes release a lab run uses and its DRA
feature gates (issue 51 item 1: 1.37.2 beside 1.35.4, each release's gates by stage).

The shell side is checked with bash itself as the oracle: lab/tools.sh, lab/up and the
image build source lab/versions.sh, the integration tier and the benchmarks call load().
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "lab"
sys.path.insert(0, str(LAB))
import versions as lab_versions  # noqa: E402  (lab/versions.py)

sys.path.remove(str(LAB))

# The gates gpu-dra needs turned on, per minor (their stage there: lab/versions.env's
# comments, docs/compatibility.md). 1.37 has the three betas (on by default) named and the
# GA ones (DRADeviceTaints, DRADeviceTaintRules, DRAExtendedResource) not.
GATES = {
    "v1_35": {"DRAPartitionableDevices", "DRAConsumableCapacity", "DRADeviceTaints",
              "DRADeviceTaintRules", "DRAExtendedResource", "ResourceHealthStatus"},
    "v1_37": {"DRAPartitionableDevices", "DRAConsumableCapacity", "ResourceHealthStatus"},
}


def shell(env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "GPUK8S_KUBE_VERSION"} | env
    return subprocess.run(["bash", "-c", f'set -euo pipefail; . "{LAB}/versions.sh"; {script}'],
                          env=full, capture_output=True, text=True, check=False)


def test_default_release_is_versions_env_and_its_minor_gates() -> None:
    pinned = lab_versions.read()
    got = lab_versions.load({})
    assert got["KUBE_VERSION"] == pinned["KUBE_VERSION"]
    key = lab_versions.minor_key(pinned["KUBE_VERSION"])
    assert got["KUBE_FEATURE_GATES"] == pinned[f"KUBE_FEATURE_GATES_{key}"]
    assert got["KUBE_RUNTIME_CONFIG"] == pinned[f"KUBE_RUNTIME_CONFIG_{key}"]


def test_override_picks_the_release_and_its_gates() -> None:
    got = lab_versions.load({"GPUK8S_KUBE_VERSION": "v1.37.2"})
    assert got["KUBE_VERSION"] == "v1.37.2"
    assert dict(g.split("=") for g in got["KUBE_FEATURE_GATES"].split(",")) == \
        dict.fromkeys(GATES["v1_37"], "true")
    assert got["KUBE_RUNTIME_CONFIG"] == ""  # DeviceTaintRule is resource.k8s.io/v1 there
    older = lab_versions.load({"GPUK8S_KUBE_VERSION": "v1.35.4"})
    assert dict(g.split("=") for g in older["KUBE_FEATURE_GATES"].split(",")) == \
        dict.fromkeys(GATES["v1_35"], "true")
    assert older["KUBE_RUNTIME_CONFIG"] == "resource.k8s.io/v1alpha3=true"


def test_unknown_release_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"GPUK8S_KUBE_VERSION='v1\.36\.0'.*v1\.35\.4, v1\.37\.2"):
        lab_versions.load({"GPUK8S_KUBE_VERSION": "v1.36.0"})
    with pytest.raises(ValueError, match=r"expected v1\.<minor>\.<patch>"):
        lab_versions.minor_key("1.37")


def test_a_release_without_its_gate_list_is_refused(tmp_path: Path) -> None:
    env = tmp_path / "versions.env"
    env.write_text("KUBE_VERSION=v1.36.1\nKUBE_VERSIONS=v1.36.1\n"
                   "KUBE_FEATURE_GATES_v1_35=A=true\nKUBE_RUNTIME_CONFIG_v1_35=\n")
    with pytest.raises(ValueError, match=r"KUBE_FEATURE_GATES_v1_36 missing for v1\.36\.1"):
        lab_versions.load({}, env)


@pytest.mark.parametrize("release", ["", "v1.35.4", "v1.37.2"])
def test_shell_sees_what_python_sees(release: str) -> None:
    env = {"GPUK8S_KUBE_VERSION": release} if release else {}
    want = lab_versions.load(env)
    proc = shell(env, 'printf "%s\\n" "$KUBE_VERSION" "$KUBE_FEATURE_GATES" '
                      '"$KUBE_RUNTIME_CONFIG" "$ETCD_VERSION"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [want["KUBE_VERSION"], want["KUBE_FEATURE_GATES"],
                                        want["KUBE_RUNTIME_CONFIG"], want["ETCD_VERSION"]]


def test_shell_stops_on_an_unknown_release() -> None:
    proc = shell({"GPUK8S_KUBE_VERSION": "v1.99.0"}, "echo reached")
    assert proc.returncode == 2
    assert "reached" not in proc.stdout
    assert "v1.99.0" in proc.stderr and "allowed: v1.35.4, v1.37.2" in proc.stderr


def test_every_release_has_its_go_module_and_gate_lists() -> None:
    pinned = lab_versions.read()
    releases = pinned["KUBE_VERSIONS"].split(",")
    assert pinned["KUBE_VERSION"] in releases
    for release in releases:
        mod = LAB / "gomod" / "kube" / release
        assert f"require k8s.io/kubernetes {release}\n" in (mod / "go.mod").read_text()
        assert f"k8s.io/kubernetes {release} " in (mod / "go.sum").read_text()
        key = lab_versions.minor_key(release)
        assert set(GATES) >= {key}
        gates = pinned[f"KUBE_FEATURE_GATES_{key}"]
        assert {g.split("=")[0] for g in gates.split(",")} == GATES[key]
