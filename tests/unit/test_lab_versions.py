"""lab/versions.py and lab/versions.sh: the Kubernetes release a lab run uses and its DRA
feature gates (issue 51 item 1: 1.37.2 beside 1.35.4, each release's gates by stage), and
`lab/up --kube`, which records the lab's release for every later lab/* command.

The shell side is checked with bash itself as the oracle: lab/tools.sh, lab/up and the
image build source lab/versions.sh, the integration tier and the benchmarks call load().
Every case names its own state dir (GPUK8S_LAB_STATE), so the machine's lab plays no part.
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


@pytest.fixture(autouse=True)
def no_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state dir without a lab, for load() and every script these tests run."""
    state = tmp_path / "state"
    monkeypatch.setenv("GPUK8S_LAB_STATE", str(state))
    monkeypatch.delenv("GPUK8S_KUBE_VERSION", raising=False)
    return state


def shell(env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f'set -euo pipefail; . "{LAB}/versions.sh"; {script}'],
                          env=os.environ | env, capture_output=True, text=True, check=False)


def test_default_release_is_versions_env_and_its_minor_gates() -> None:
    pinned = lab_versions.read()
    got = lab_versions.load()
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
        lab_versions.load({"GPUK8S_LAB_STATE": str(tmp_path)}, env)


@pytest.mark.parametrize("release", ["", "v1.35.4", "v1.37.2"])
def test_shell_sees_what_python_sees(release: str, tmp_path: Path) -> None:
    # a state directory of no lab: this machine's own lab may run another release
    env = {"GPUK8S_LAB_STATE": str(tmp_path)}
    if release:
        env["GPUK8S_KUBE_VERSION"] = release
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


# -- the lab's recorded release (lab/up --kube) ------------------------------------------------
def gates_of(resolved: dict[str, str]) -> set[str]:
    return {g.split("=")[0] for g in resolved["KUBE_FEATURE_GATES"].split(",")}


def test_the_labs_recorded_release_is_used_without_the_variable(no_lab: Path) -> None:
    no_lab.mkdir()
    (no_lab / "kube-version").write_text("v1.35.4\n")
    got = lab_versions.load()
    assert got["KUBE_VERSION"] == "v1.35.4" and gates_of(got) == GATES["v1_35"]
    assert lab_versions.load(lab=True)["KUBE_VERSION"] == "v1.35.4"
    assert lab_versions.chosen(os.environ)
    # the variable still picks another release for a private control plane (integration
    # tier, benchmarks), but not for a command acting on the lab
    assert lab_versions.load({**os.environ, "GPUK8S_KUBE_VERSION": "1.37.2"})[
        "KUBE_VERSION"] == "v1.37.2"
    with pytest.raises(ValueError, match=r"GPUK8S_KUBE_VERSION='1\.37\.2': the lab in .* runs "
                                         r"v1\.35\.4 .*lab/down, then lab/up --kube v1\.37\.2"):
        lab_versions.load({**os.environ, "GPUK8S_KUBE_VERSION": "1.37.2"}, lab=True)
    assert lab_versions.load({**os.environ, "GPUK8S_KUBE_VERSION": "1.35.4"}, lab=True)[
        "KUBE_VERSION"] == "v1.35.4"


def test_a_lab_older_than_the_record_runs_the_release_of_its_apiserver(no_lab: Path) -> None:
    """A lab brought up before lab/up recorded its release: its kube-apiserver's recorded
    command line (lab/lib.sh start_daemon, NUL-separated) names the build directory."""
    (no_lab / "run").mkdir(parents=True)
    (no_lab / "run" / "kube-apiserver.cmd").write_bytes(
        b"/var/cache/gpuk8s/bin/kube-v1.35.4/kube-apiserver\0--secure-port=6443\0")
    assert lab_versions.load()["KUBE_VERSION"] == "v1.35.4"
    (no_lab / "kube-version").write_text("v1.37.2\n")  # the record wins
    assert lab_versions.load()["KUBE_VERSION"] == "v1.37.2"


def test_no_lab_means_versions_env_and_nothing_chosen() -> None:
    assert not lab_versions.chosen(os.environ)
    assert lab_versions.load(lab=True)["KUBE_VERSION"] == lab_versions.read()["KUBE_VERSION"]


def test_a_recorded_release_the_checkout_does_not_know_is_refused(no_lab: Path) -> None:
    no_lab.mkdir()
    (no_lab / "kube-version").write_text("v1.34.1\n")
    with pytest.raises(ValueError, match=r"the lab's release 'v1\.34\.1' \(from .*kube-version\)"
                                         r": not a release the lab knows; allowed: v1\.35\.4"):
        lab_versions.load()


def lab_up(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LAB / "up"), *args], capture_output=True, text=True,
                          check=False)


@pytest.mark.parametrize("args", [["--kube", "1.36.0"], ["--kube=v1.36.0"]])
def test_lab_up_refuses_an_unknown_release_before_anything_starts(
        args: list[str], no_lab: Path) -> None:
    done = lab_up(*args, "--no-fleet")
    assert done.returncode == 2, done.stderr
    assert "not a release the lab knows; allowed: v1.35.4, v1.37.2" in done.stderr
    assert not no_lab.exists(), "lab/up made its state dir"


def test_lab_up_needs_a_release_after_kube(no_lab: Path) -> None:
    done = lab_up("--kube")
    assert done.returncode != 0
    assert "--kube needs a release: one of v1.35.4,v1.37.2" in done.stderr
    assert not (no_lab / "kube-version").exists()


def test_lab_up_refuses_to_change_a_labs_release(no_lab: Path) -> None:
    no_lab.mkdir()
    (no_lab / "kube-version").write_text("v1.37.2\n")
    done = lab_up("--kube", "v1.35.4", "--no-fleet")
    assert done.returncode == 2
    assert "runs v1.37.2" in done.stderr and "lab/down, then lab/up --kube v1.35.4" in done.stderr
    assert (no_lab / "kube-version").read_text() == "v1.37.2\n"
    assert sorted(p.name for p in no_lab.iterdir()) == ["kube-version"]


@pytest.mark.parametrize("args", [["--kube", "1.35.4"], ["--kube=v1.35.4"],
                                  ["--preset", "c500-8", "--kube", "v1.35.4", "--no-fleet"]])
def test_lab_up_kube_is_recorded_for_the_later_lab_commands(
        args: list[str], no_lab: Path) -> None:
    """lab/up's phases defined, not run (LAB_UP_SOURCE_ONLY=1), then its first step: the
    record; a later lab/* command (lab/lib.sh) and load() see the release lab/up chose."""
    script = (f'LAB_UP_SOURCE_ONLY=1; . "{LAB}/up" "$@"; record_release; '
              'printf "%s\\n" "$KUBE_VERSION" "$KUBE_FEATURE_GATES" "$SCHEDULER_IMAGE"')
    done = subprocess.run(["bash", "-c", script, "lab/up", *args], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    older = lab_versions.load({"GPUK8S_KUBE_VERSION": "v1.35.4"})
    assert done.stdout.splitlines() == ["v1.35.4", older["KUBE_FEATURE_GATES"],
                                        "registry.k8s.io/kube-scheduler:v1.35.4"]
    assert (no_lab / "kube-version").read_text() == "v1.35.4\n"
    later = subprocess.run(["bash", "-c", f'. "{LAB}/lib.sh"; echo "$KUBE_VERSION $(kube_bin '
                            'kubelet)"'], capture_output=True, text=True, check=False)
    assert later.returncode == 0, later.stderr
    cache = os.environ.get("GPUK8S_CACHE", "/var/cache/gpuk8s")
    assert later.stdout.split() == ["v1.35.4", f"{cache}/bin/kube-v1.35.4/kubelet"]
    assert lab_versions.load()["KUBE_VERSION"] == "v1.35.4"
    # and lab/up again without --kube keeps the lab's release
    again = subprocess.run(["bash", "-c", f'LAB_UP_SOURCE_ONLY=1; . "{LAB}/up"; '
                            'echo "$KUBE_VERSION"'], capture_output=True, text=True, check=False)
    assert again.stdout.strip() == "v1.35.4", again.stderr


def test_teardown_takes_a_recorded_release_the_checkout_no_longer_knows(
        no_lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lab/down must tear down a lab whose release was dropped from KUBE_VERSIONS: the
    release is used (its programs stop what runs), with a warning naming it."""
    no_lab.mkdir()
    (no_lab / "kube-version").write_text("v1.34.1\n")
    got = lab_versions.load(lab=True, teardown=True)
    assert (got["KUBE_VERSION"], got["KUBE_FEATURE_GATES"], got["KUBE_RUNTIME_CONFIG"]) == \
        ("v1.34.1", "", "")
    warning = capsys.readouterr().err
    assert "warning: the lab's release 'v1.34.1'" in warning
    assert "not a release the lab knows; allowed: v1.35.4, v1.37.2" in warning
    # only the lab's own record is tolerated: an unknown release asked for is still refused
    with pytest.raises(ValueError, match=r"not a release the lab knows; allowed: v1\.35\.4"):
        lab_versions.load({"GPUK8S_KUBE_VERSION": "v1.33.0",
                           "GPUK8S_LAB_STATE": str(no_lab / "none")}, lab=True, teardown=True)


def test_only_lab_down_tolerates_an_unknown_recorded_release(no_lab: Path) -> None:
    """lab/down's preamble (everything before as_root: its settings, lab/lib.sh) resolves the
    dropped release with a warning, and exports that to what it runs (lab/fleetctl down,
    lab/netpol.sh stop); every other lab command (lab/lib.sh alone) refuses it."""
    no_lab.mkdir()
    (no_lab / "kube-version").write_text("v1.34.1\n")
    head, sep, _ = (LAB / "down").read_text().partition('\nas_root "$@"\n')
    assert sep, "lab/down calls as_root after sourcing lab/lib.sh"
    here = '$(dirname "${BASH_SOURCE[0]}")'
    assert here in head
    head = head.replace(here, str(LAB))  # run from bash -c, not from lab/
    cache = os.environ.get("GPUK8S_CACHE", "/var/cache/gpuk8s")
    down = subprocess.run(["bash", "-c", head + '\necho "$KUBE_VERSION $(kube_bin kube-proxy)"'
                           f'\nbash -c \'. "{LAB}/lib.sh"; echo "$KUBE_VERSION"\''],
                          capture_output=True, text=True, check=False)
    assert down.returncode == 0, down.stderr
    assert down.stdout.split() == ["v1.34.1", f"{cache}/bin/kube-v1.34.1/kube-proxy", "v1.34.1"]
    assert "warning: the lab's release 'v1.34.1'" in down.stderr
    other = subprocess.run(["bash", "-c", f'. "{LAB}/lib.sh"; echo "$KUBE_VERSION"'],
                           capture_output=True, text=True, check=False)
    assert other.returncode == 2 and other.stdout == ""
    assert ("the lab's release 'v1.34.1'" in other.stderr
            and "not a release the lab knows; allowed: v1.35.4, v1.37.2" in other.stderr)
