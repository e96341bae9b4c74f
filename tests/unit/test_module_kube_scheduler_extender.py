"""kube_scheduler_extender through the AnsibleModule harness, on a copy of a control plane.

The manifest is a realistic kubeadm one with comments (tests/ansible/data); every
test works under a temporary host_root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.ansible import schedfiles
from gpuk8s.ansible.harness import run_module
from gpuk8s.core import schedconf
from gpuk8s.core.errors import ManifestError
from gpuk8s.core.schedconf import ANNOTATION

DATA = Path(__file__).resolve().parents[1] / "ansible" / "data"
MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"
CONFIG = "etc/metax/extender.yaml"
URL = "http://10.96.0.50:8080"
MODULE = "kube_scheduler_extender"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    host = tmp_path / "host"
    (host / MANIFEST).parent.mkdir(parents=True)
    shutil.copy(DATA / "kube-scheduler.yaml", host / MANIFEST)
    return host


def run(root: Path, check: bool = False, **args: Any) -> dict[str, Any]:
    args.setdefault("url_prefix", URL)
    return run_module(MODULE, {"host_root": str(root), **args}, check_mode=check, diff=True)


def sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def marker_of(root: Path) -> dict[str, Any]:
    pod = schedfiles.read(str(root / MANIFEST)).data
    return json.loads(pod["metadata"]["annotations"][ANNOTATION])  # type: ignore[no-any-return]


def marker_lines(root: Path) -> str:
    """The lines the marker adds to a manifest without annotations."""
    text = (root / MANIFEST).read_text()
    start = text.index("  annotations:\n")
    end = text.index("\n", text.index(ANNOTATION, start)) + 1
    return text[start:end]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_four_step_idempotence(root: Path) -> None:
    original = snapshot(root)
    first_check = run(root, check=True)
    assert first_check["changed"] and first_check["manifest_changed"]
    assert snapshot(root) == original, "check mode wrote something"
    applied = run(root)
    assert applied["changed"]
    assert applied["api_version"] == "kubescheduler.config.k8s.io/v1"  # image tag v1.29.3
    after_apply = snapshot(root)
    second_check = run(root, check=True)
    assert not second_check["changed"], second_check["changes"]
    second = run(root)
    assert not second["changed"]
    assert second["files"] == []
    assert snapshot(root) == after_apply


def test_present_writes_spec_config_and_keeps_comments(root: Path) -> None:
    result = run(root, managed_resources=[{"name": "metax-tech.com/gpu"}])
    assert not result.get("failed"), result
    config = schedfiles.read(str(root / CONFIG)).data
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"
    assert config["extenders"] == [{
        "urlPrefix": URL, "filterVerb": "filter", "prioritizeVerb": "prioritize",
        "weight": 500, "enableHTTPS": False, "nodeCacheCapable": True, "ignorable": False,
        "managedResources": [{"name": "metax-tech.com/gpu", "ignoredByScheduler": False}],
    }]
    text = (root / MANIFEST).read_text()
    for comment in ("# kube-scheduler static pod, laid out the way kubeadm writes it.",
                    "--bind-address=127.0.0.1  # metrics and health only on loopback",
                    "cpu: 100m  # raised from kubeadm's default after an incident",
                    "  # the scheduler's own credentials"):
        assert comment in text
    pod = schedfiles.read(str(root / MANIFEST)).data
    container = pod["spec"]["containers"][0]
    assert "--config=/etc/metax/extender.yaml" in container["command"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/metax/extender.yaml"]["readOnly"] is True
    assert mounts["/etc/kubernetes/scheduler.conf"]["readOnly"] is True
    volumes = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in pod["spec"]["volumes"]}
    assert volumes == {"/etc/kubernetes/scheduler.conf": "FileOrCreate",
                       "/etc/metax/extender.yaml": "File"}
    # the marker: the kubelet restarts the scheduler whenever the configuration changes
    assert list(pod["metadata"]) == ["creationTimestamp", "labels", "name", "namespace",
                                     "annotations"]
    marker = json.loads(pod["metadata"]["annotations"][ANNOTATION])
    assert marker == {"configHash": sha256((root / CONFIG).read_text()), "urlPrefix": URL,
                      "configFlag": True}
    assert "creationTimestamp: null" in text


def test_node_cache_capable_defaults_to_true_and_the_manuals_false_stays_possible(
    root: Path,
) -> None:
    assert run(root)["changed"]
    config = schedfiles.read(str(root / CONFIG)).data
    assert config["extenders"][0]["nodeCacheCapable"] is True
    result = run(root, node_cache_capable=False)  # SPEC §7's own setting
    assert result["changed"]
    assert schedfiles.read(str(root / CONFIG)).data["extenders"][0]["nodeCacheCapable"] is False


def test_absent_gives_back_the_original_bytes(root: Path) -> None:
    original = (root / MANIFEST).read_bytes()
    run(root, weight=10, http_timeout="30s")
    removed = run(root, state="absent")
    assert removed["changed"]
    assert (root / MANIFEST).read_bytes() == original
    assert not (root / CONFIG).exists()
    again = run(root, state="absent")
    assert not again["changed"]


def test_backup_holds_the_original(root: Path) -> None:
    original = (root / MANIFEST).read_bytes()
    result = run(root, backup=True)
    assert len(result["backup_files"]) == 1  # the config file did not exist yet
    backup = Path(result["backup_files"][0])
    assert backup.read_bytes() == original
    # never next to the manifest: the kubelet would run it as a second scheduler
    assert backup.parent != (root / MANIFEST).parent
    assert str(backup).startswith(str(root / "var/lib/gpuk8s/backups"))


@pytest.mark.parametrize(
    "text",
    [
        "apiVersion: v1\nkind: Pod\nspec: [unclosed\n",
        "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: etcd\n    command: [etcd]\n",
        "kind: Deployment\n",
        "- just\n- a list\n",
    ],
)
def test_malformed_manifest_is_an_error_and_untouched(root: Path, text: str) -> None:
    (root / MANIFEST).write_text(text)
    before = os.stat(root / MANIFEST)
    result = run(root, backup=True)
    assert result["failed"]
    assert "kube-scheduler.yaml" in result["msg"]
    assert (root / MANIFEST).read_text() == text
    assert os.stat(root / MANIFEST).st_mtime_ns == before.st_mtime_ns
    assert not (root / CONFIG).exists()
    assert not (root / "var").exists()


def test_missing_manifest_is_an_error(tmp_path: Path) -> None:
    result = run(tmp_path)
    assert result["failed"] and "does not exist" in result["msg"]


@pytest.mark.parametrize(
    ("version", "api"),
    [("v1.22.3", "v1beta2"), ("1.23", "v1beta3"), ("v1.24.9", "v1beta3"), ("1.25.0", "v1")],
)
def test_api_version_from_option(root: Path, version: str, api: str) -> None:
    text = (root / MANIFEST).read_text().replace("kube-scheduler:v1.29.3", "kube-scheduler:site")
    (root / MANIFEST).write_text(text)  # a tag that is not a version: the option decides
    result = run(root, kubernetes_version=version)
    assert result["api_version"] == f"kubescheduler.config.k8s.io/{api}"
    assert schedfiles.read(str(root / CONFIG)).data["apiVersion"] == result["api_version"]


def test_api_version_from_image_tag(root: Path) -> None:
    text = (root / MANIFEST).read_text().replace(":v1.29.3", ":v1.23.17")
    (root / MANIFEST).write_text(text)
    assert run(root)["api_version"] == "kubescheduler.config.k8s.io/v1beta3"


def test_untagged_image_needs_kubernetes_version(root: Path) -> None:
    text = (root / MANIFEST).read_text().replace("kube-scheduler:v1.29.3", "kube-scheduler:latest")
    (root / MANIFEST).write_text(text)
    result = run(root)
    assert result["failed"] and "kubernetes_version" in result["msg"]
    assert not (root / CONFIG).exists()


FOREIGN = """\
# site scheduler profile: keep the default plugins
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
extenders:
- urlPrefix: http://127.0.0.1:9999
  filterVerb: filter
  weight: 1  # theirs
"""


def add_mount(text: str, name: str, mount_path: str, host_path: str, kind: str) -> str:
    """The sample manifest's text with one more hostPath mount (after kubeadm's)."""
    return text.replace(
        "      name: kubeconfig\n      readOnly: true\n",
        "      name: kubeconfig\n      readOnly: true\n"
        f"    - mountPath: {mount_path}\n      name: {name}\n      readOnly: true\n",
    ).replace(
        "    name: kubeconfig\nstatus",
        f"    name: kubeconfig\n  - hostPath:\n      path: {host_path}\n"
        f"      type: {kind}\n    name: {name}\nstatus",
    )


def with_foreign_config(root: Path) -> Path:
    """The scheduler already runs --config=/etc/kubernetes/sched/config.yaml via a dir mount."""
    text = (root / MANIFEST).read_text()
    text = add_mount(text.replace(
        "    - --leader-elect=true\n",
        "    - --leader-elect=true\n    - --config=/etc/kubernetes/sched/config.yaml\n",
    ), "sched", "/etc/kubernetes/sched", "/srv/sched", "Directory")
    (root / MANIFEST).write_text(text)
    path = root / "srv/sched/config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(FOREIGN)
    return path


def test_existing_config_gets_our_extender_appended(root: Path) -> None:
    theirs = with_foreign_config(root)
    manifest = (root / MANIFEST).read_bytes()
    result = run(root)
    assert result["changed"] and result["mode"] == "appended"
    assert result["config_path"] == "/etc/kubernetes/sched/config.yaml"
    # only the marker: the scheduler must restart to read its changed file
    assert result["manifest_changed"]
    config = schedfiles.read(str(theirs)).data
    assert marker_of(root) == {"configHash": sha256(theirs.read_text()), "urlPrefix": URL,
                               "configFlag": False,
                               "entryHash": schedconf.entry_hash(config["extenders"][1]),
                               "profileKeys": ["percentageOfNodesToScore", "profiles"]}
    assert (root / MANIFEST).read_text().replace(marker_lines(root), "") == manifest.decode()
    assert not (root / CONFIG).exists()
    text = theirs.read_text()
    assert text.startswith(FOREIGN)  # theirs kept, comments included; ours appended
    assert [e["urlPrefix"] for e in config["extenders"]] == ["http://127.0.0.1:9999", URL]
    assert not run(root)["changed"]
    assert run(root, weight=20)["changed"]
    assert schedfiles.read(str(theirs)).data["extenders"][1]["weight"] == 20
    removed = run(root, state="absent")
    assert removed["changed"]
    assert theirs.read_text() == FOREIGN
    assert (root / MANIFEST).read_bytes() == manifest


def test_scheduler_profile_is_written_with_our_extender(root: Path) -> None:
    assert not run(root).get("failed")
    config = schedfiles.read(str(root / CONFIG)).data
    assert config["percentageOfNodesToScore"] == 100
    assert config["profiles"][0]["pluginConfig"][0]["name"] == "NodeResourcesFit"
    before = (root / MANIFEST).read_text()
    switched = run(root, scheduler_profile="none")
    # the configuration changed, so the static pod's config-hash annotation changes with it and
    # the kubelet restarts kube-scheduler on the new profile
    assert switched["changed"] and switched["manifest_changed"]
    assert (root / MANIFEST).read_text() != before
    assert "profiles" not in schedfiles.read(str(root / CONFIG)).data
    assert run(root, scheduler_profile="spread")["failed"]


def test_scheduler_profile_goes_into_an_administrators_file_where_it_lacks_the_keys(
    root: Path,
) -> None:
    """kubespray's file (no percentageOfNodesToScore, no profiles) gets packing's keys, so a
    scheduler on it packs GPU pods like one on our own file; absent, or the profile none,
    removes exactly them. A key the administrator set stays theirs, with a warning."""
    theirs = with_foreign_config(root)
    manifest = (root / MANIFEST).read_bytes()
    assert run(root)["changed"]
    config = schedfiles.read(str(theirs)).data
    packing = schedconf.packing_profile()
    assert config["percentageOfNodesToScore"] == packing["percentageOfNodesToScore"]
    assert config["profiles"] == packing["profiles"]
    assert theirs.read_text().startswith(FOREIGN)  # their content first, as it was
    assert not run(root)["changed"]
    switched = run(root, scheduler_profile="none")
    assert switched["changed"] and switched["manifest_changed"]
    config = schedfiles.read(str(theirs)).data
    assert "profiles" not in config and "percentageOfNodesToScore" not in config
    assert "profileKeys" not in marker_of(root)
    assert run(root)["changed"]
    assert run(root, state="absent")["changed"]
    assert theirs.read_text() == FOREIGN and (root / MANIFEST).read_bytes() == manifest
    # their own percentageOfNodesToScore: left as it is (and after absent), profiles added
    own = FOREIGN + "percentageOfNodesToScore: 50\n"
    theirs.write_text(own)
    plan = schedfiles.plan(schedfiles.Request(
        state="present", spec=schedconf.ExtenderSpec(URL), url_prefix=URL, host_root=str(root)))
    assert any("sets percentageOfNodesToScore itself" in w for w in plan.warnings), plan.warnings
    assert not run(root).get("failed")
    config = schedfiles.read(str(theirs)).data
    assert config["percentageOfNodesToScore"] == 50 and config["profiles"] == packing["profiles"]
    assert marker_of(root)["profileKeys"] == ["profiles"]
    # a profile of ours edited by hand since: absent leaves it, with a warning
    theirs.write_text(theirs.read_text().replace("type: MostAllocated", "type: LeastAllocated"))
    plan = schedfiles.plan(schedfiles.Request(state="absent", spec=None, url_prefix=None,
                                              host_root=str(root)))
    assert any("profiles, written by gpuk8s" in w for w in plan.warnings), plan.warnings
    assert run(root, state="absent")["changed"]
    config = schedfiles.read(str(theirs)).data
    assert config["percentageOfNodesToScore"] == 50 and "profiles" in config
    assert "extenders" in config and len(config["extenders"]) == 1


def test_scheduler_profile_none_warns_of_an_edited_key_it_leaves(root: Path) -> None:
    """The profile none, like absent, leaves a profile key gpuk8s wrote and an administrator
    edited since in their file, and says so: the key is no longer recorded as gpuk8s'."""
    theirs = with_foreign_config(root)
    assert run(root)["changed"]
    theirs.write_text(theirs.read_text().replace("type: MostAllocated", "type: LeastAllocated"))
    edited = theirs.read_text()
    plan = schedfiles.plan(schedfiles.Request(
        state="present", spec=schedconf.ExtenderSpec(URL), url_prefix=URL, host_root=str(root),
        profile="none"))
    assert [w for w in plan.warnings if "profiles, written by gpuk8s" in w] == [
        "/srv/sched/config.yaml: profiles, written by gpuk8s's scheduler_profile, "
        "was edited since: left in place and no longer gpuk8s's; remove it yourself"]
    switched = run(root, scheduler_profile="none")
    assert switched["changed"]
    config = schedfiles.read(str(theirs)).data
    assert "percentageOfNodesToScore" not in config  # unedited: removed
    assert config["profiles"] == schedfiles.parse(edited, "edited").data["profiles"]
    assert "LeastAllocated" in theirs.read_text()
    assert "profileKeys" not in marker_of(root)


def test_absent_in_foreign_config_without_a_record_changes_nothing(root: Path) -> None:
    """No gpuk8s record in the manifest: nothing of the administrator's file is ours."""
    theirs = with_foreign_config(root)
    before = snapshot(root)
    result = run_module(MODULE, {"host_root": str(root), "state": "absent"})
    assert not result.get("failed") and not result["changed"], result
    assert snapshot(root) == before and theirs.read_text() == FOREIGN


def test_invalid_options_fail_naming_the_field(root: Path) -> None:
    original = snapshot(root)
    result = run(root, weight=0)
    assert result["failed"] and "weight" in result["msg"]
    result = run(root, enable_https=True)
    assert result["failed"] and "enable_https" in result["msg"]
    result = run_module(MODULE, {"host_root": str(root)})
    assert result["failed"] and "url_prefix" in result["msg"]
    assert snapshot(root) == original


def test_a_config_file_nobody_refers_to_is_not_overwritten_nor_removed(root: Path) -> None:
    """The manual's own extender.yaml, written by hand before the manifest edit: the
    module neither replaces it (present fails naming config_path, nothing written) nor
    deletes it (absent warns and keeps it); once ours, it is ours to change."""
    hand = "# mine\napiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
    (root / CONFIG).parent.mkdir(parents=True)
    (root / CONFIG).write_text(hand)
    original = snapshot(root)
    result = run(root)
    assert result["failed"] and "config_path /etc/metax/extender.yaml exists" in result["msg"]
    assert snapshot(root) == original
    result = run(root, state="absent")
    assert not result.get("failed") and not result["changed"]
    plan = schedfiles.plan(schedfiles.Request(state="absent", spec=None, url_prefix=URL,
                                              host_root=str(root)))
    assert any("left as it is" in w for w in plan.warnings) and plan.files == []
    assert snapshot(root) == original
    (root / CONFIG).unlink()
    assert run(root)["changed"]  # ours now: a changed weight rewrites it, absent removes it
    assert run(root, weight=7)["changed"]
    assert run(root, state="absent")["changed"] and not (root / CONFIG).exists()


def test_failing_validate_command_writes_nothing(root: Path) -> None:
    original = snapshot(root)
    result = run(root, validate="grep -q no-such-text %s")
    assert result["failed"] and "validate" in result["msg"]
    assert snapshot(root) == original
    assert not list((root / MANIFEST).parent.glob(".gpuk8s-*"))
    assert run(root, validate="grep -q kind %s")["changed"]


def test_diff_shows_both_files(root: Path) -> None:
    result = run(root, check=True)
    headers = sorted(d["after_header"] for d in result["diff"])
    assert headers == sorted([str(root / CONFIG), str(root / MANIFEST)])
    manifest_diff = next(d for d in result["diff"] if d["after_header"].endswith("yaml")
                         and "manifests" in d["after_header"])
    assert "--config=/etc/metax/extender.yaml" in manifest_diff["after"]
    assert "--config" not in manifest_diff["before"]


def test_four_space_manifest_keeps_its_style(root: Path) -> None:
    doc = schedfiles.read(str(root / MANIFEST))
    doc.style = (4, 6, 4)
    four = doc.render()
    (root / MANIFEST).write_text(four)
    run(root)
    patched = schedfiles.read(str(root / MANIFEST))
    assert patched.exact and patched.style == (4, 6, 4)
    run(root, state="absent")
    assert (root / MANIFEST).read_text() == four


def test_parse_rejects_invalid_yaml() -> None:
    with pytest.raises(ManifestError, match="not valid YAML"):
        schedfiles.parse("a: [b\n", "m.yaml")


# --------------------------------------------------------------------------- issue 16

LAB_MANIFEST = Path(__file__).resolve().parents[2] / "lab" / "manifests" / "kube-scheduler.yaml"


def test_changed_weight_restarts_the_scheduler(root: Path) -> None:
    """kube-scheduler reads its configuration only at start: a change of the file alone
    must change the manifest too (the marker's hash), so the kubelet restarts the pod."""
    run(root)
    first = marker_of(root)["configHash"]
    changed = run(root, weight=20)
    assert changed["manifest_changed"]
    assert marker_of(root)["configHash"] == sha256((root / CONFIG).read_text()) != first
    assert not run(root, weight=20)["changed"]


MANUAL_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
extenders:
- urlPrefix: http://10.96.0.50:8080
  filterVerb: filter
  prioritizeVerb: prioritize
  weight: 500
  enableHTTPS: false
  nodeCacheCapable: false
  ignorable: false
"""


def enable_by_hand(root: Path) -> str:
    """What an administrator who followed the manual's steps has: our --config path, a
    mount and volume named their way, the file written by hand."""
    text = add_mount((root / MANIFEST).read_text().replace(
        "    - --leader-elect=true\n",
        "    - --leader-elect=true\n    - --config=/etc/metax/extender.yaml\n",
    ), "extender", "/etc/metax/extender.yaml", "/etc/metax/extender.yaml", "File")
    (root / MANIFEST).write_text(text)
    (root / CONFIG).parent.mkdir(parents=True)
    (root / CONFIG).write_text(MANUAL_CONFIG)
    return text


def test_manifest_enabled_by_hand_gets_no_second_mount_and_keeps_its_own(root: Path) -> None:
    """The administrator's hand-written entry (the manual's, at our very URL) is left
    alone: ours is added beside it, with a warning, and only ours goes on disable.
    Before: theirs was taken over (set to nodeCacheCapable: true) and then deleted,
    leaving extenders: []."""
    by_hand = enable_by_hand(root)
    plan = schedfiles.plan(schedfiles.Request(
        state="present", spec=schedconf.ExtenderSpec(URL), url_prefix=URL, host_root=str(root)))
    assert any("extenders[0] calls http://10.96.0.50:8080 too and was not written by gpuk8s"
               in w for w in plan.warnings), plan.warnings
    result = run(root, weight=300)
    assert not result.get("failed"), result
    assert result["mode"] == "appended"
    pod = schedfiles.read(str(root / MANIFEST)).data
    paths = [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
    assert sorted(paths) == ["/etc/kubernetes/scheduler.conf", "/etc/metax/extender.yaml"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["kubeconfig", "extender"]
    text = (root / CONFIG).read_text()
    assert text.startswith(MANUAL_CONFIG)  # theirs, byte for byte
    config = schedfiles.read(str(root / CONFIG)).data
    assert [(e["urlPrefix"], e["weight"], e["nodeCacheCapable"])
            for e in config["extenders"]] == [(URL, 500, False), (URL, 300, True)]
    # a second run finds ours (the marker's entry hash), not theirs
    assert not run(root, weight=300)["changed"]
    assert run(root, weight=250)["changed"]
    config = schedfiles.read(str(root / CONFIG)).data
    assert [e["weight"] for e in config["extenders"]] == [500, 250]
    # disabling removes our entry and our marker, and keeps the admin's flag, volume and entry
    removed = run(root, state="absent")
    assert removed["changed"]
    assert (root / MANIFEST).read_text() == by_hand
    assert (root / CONFIG).read_text() == MANUAL_CONFIG
    # a second disable finds no record of ours: the admin's entry at our URL stays
    again = run(root, state="absent")
    assert not again.get("failed") and not again["changed"], again
    plan = schedfiles.plan(schedfiles.Request(state="absent", spec=None, url_prefix=URL,
                                              host_root=str(root)))
    assert any(f"the entry at {URL} is left in place" in w for w in plan.warnings), plan
    assert plan.files == []
    assert (root / MANIFEST).read_text() == by_hand
    assert (root / CONFIG).read_text() == MANUAL_CONFIG
    check = run(root, check=True, state="absent")
    assert not check["changed"] and (root / CONFIG).read_text() == MANUAL_CONFIG


def test_a_resource_both_extenders_manage_is_refused_before_writing(root: Path) -> None:
    """kube-scheduler refuses a managed resource listed by two extenders (and would not
    start): the module fails naming it and writes nothing."""
    enable_by_hand(root)
    managed = MANUAL_CONFIG + "  managedResources:\n  - name: metax-tech.com/gpu\n" \
        "    ignoredByScheduler: false\n"
    (root / CONFIG).write_text(managed)
    before = snapshot(root)
    result = run(root, managed_resources=[{"name": "metax-tech.com/gpu"}])
    assert result["failed"]
    assert "extenders[0] and extenders[1] both manage metax-tech.com/gpu" in result["msg"]
    assert snapshot(root) == before


def test_a_manifest_that_starts_with_a_document_marker_keeps_it(root: Path) -> None:
    """Before: enable then disable lost the leading '---' line."""
    original = "---\n" + (root / MANIFEST).read_text()
    (root / MANIFEST).write_text(original)
    assert run(root)["changed"]
    assert (root / MANIFEST).read_text().startswith("---\n")
    assert run(root, state="absent")["changed"]
    assert (root / MANIFEST).read_text() == original
    ended = "# kubeadm\n%YAML 1.2\n---\n" + (root / MANIFEST).read_text()[4:] + "...\n"
    (root / MANIFEST).write_text(ended)
    run(root)
    run(root, state="absent")
    assert (root / MANIFEST).read_text() == ended


def test_tls_files_are_mounted_and_a_renewal_restarts_the_scheduler(root: Path) -> None:
    """kube-scheduler reads its client certificate only at start: new certificate files
    change the manifest's marker, so the kubelet restarts it; disable removes the mounts."""
    original = (root / MANIFEST).read_text()
    pki = root / "etc/metax/pki"
    pki.mkdir(parents=True)
    files = {"ca_file": "ca.crt", "cert_file": "client.crt", "key_file": "client.key"}
    for name in files.values():
        (pki / name).write_text(f"{name} v1\n")
    tls = {key: f"/etc/metax/pki/{name}" for key, name in files.items()}
    tls["server_name"] = "gpu-aware.metax-gpu-extensions.svc"
    https = "https://10.96.0.50:8080"
    result = run(root, url_prefix=https, enable_https=True, tls_config=tls)
    assert not result.get("failed"), result
    config = schedfiles.read(str(root / CONFIG)).data
    assert config["extenders"][0]["tlsConfig"] == {
        "insecure": False, "serverName": "gpu-aware.metax-gpu-extensions.svc",
        "certFile": "/etc/metax/pki/client.crt", "keyFile": "/etc/metax/pki/client.key",
        "caFile": "/etc/metax/pki/ca.crt"}
    pod = schedfiles.read(str(root / MANIFEST)).data
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["metax-extender-cert"] == "/etc/metax/pki/client.crt"
    assert mounts["metax-extender-key"] == "/etc/metax/pki/client.key"
    assert mounts["metax-extender-ca"] == "/etc/metax/pki/ca.crt"
    first = marker_of(root)["tlsHash"]
    assert not run(root, url_prefix=https, enable_https=True, tls_config=tls)["changed"]
    (pki / "client.crt").write_text("client.crt v2\n")  # renewed
    renewed = run(root, url_prefix=https, enable_https=True, tls_config=tls)
    assert renewed["changed"] and renewed["manifest_changed"]
    assert marker_of(root)["tlsHash"] != first
    (pki / "client.key").unlink()
    missing = run(root, url_prefix=https, enable_https=True, tls_config=tls)
    assert missing["failed"] and "/etc/metax/pki/client.key cannot be read" in missing["msg"]
    (pki / "client.key").write_text("client.key v2\n")
    assert run(root, state="absent")["changed"]
    assert (root / MANIFEST).read_text() == original


def test_check_mode_predicts_the_change_of_tls_files_written_in_the_same_run(
    root: Path,
) -> None:
    """The gpu_aware role copies the certificate files, then runs the module: in check mode
    they are not there yet (or still the old ones), so with tls_files_pending the module
    reads none of them and predicts the manifest change the real run makes; nothing is
    written. Without it a missing file is still an error."""
    files = {"ca_file": "ca.crt", "cert_file": "client.crt", "key_file": "client.key"}
    tls = {key: f"/etc/metax/pki/{name}" for key, name in files.items()}
    https: dict[str, Any] = {"url_prefix": "https://10.96.0.50:8080", "enable_https": True,
                             "tls_config": tls}
    before = snapshot(root)
    predicted = run(root, check=True, tls_files_pending=True, **https)
    assert not predicted.get("failed"), predicted
    assert predicted["changed"] and predicted["manifest_changed"]
    assert snapshot(root) == before
    refused = run(root, check=True, **https)
    assert refused["failed"] and "/etc/metax/pki/ca.crt cannot be read" in refused["msg"]
    # the real run (files written by then) reads them; tls_files_pending changes nothing there
    pki = root / "etc/metax/pki"
    pki.mkdir(parents=True)
    for name in files.values():
        (pki / name).write_text(f"{name} v1\n")
    assert run(root, tls_files_pending=True, **https)["manifest_changed"]
    first = marker_of(root)["tlsHash"]
    assert first.startswith("sha256:")
    assert not run(root, check=True, **https)["changed"]
    # renewed files, not written yet in check mode: the restart is predicted all the same
    renewal = run(root, check=True, tls_files_pending=True, **https)
    assert renewal["changed"] and renewal["manifest_changed"]
    assert marker_of(root)["tlsHash"] == first


def test_a_directory_mount_covers_the_config(root: Path) -> None:
    text = add_mount((root / MANIFEST).read_text(), "metax", "/etc/metax", "/etc/metax",
                     "DirectoryOrCreate")
    (root / MANIFEST).write_text(text)
    run(root)
    pod = schedfiles.read(str(root / MANIFEST)).data
    names = [m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
    assert names == ["kubeconfig", "metax"]  # the file is visible through /etc/metax
    run(root, state="absent")
    assert (root / MANIFEST).read_text() == text


HTTPS = {
    "url_prefix": "https://10.96.0.1/api/v1/namespaces/metax-gpu-extensions/services/"
                  "gpu-aware:8080/proxy",
    "enable_https": True,
    "tls_config": {"insecure": False, "ca_file": "/etc/kubernetes/pki/ca.crt",
                   "cert_file": "/etc/kubernetes/pki/apiserver-kubelet-client.crt",
                   "key_file": "/etc/kubernetes/pki/apiserver-kubelet-client.key"},
}


def test_tls_files_are_mounted_and_removed(root: Path) -> None:
    original = (root / MANIFEST).read_bytes()
    for key in ("ca_file", "cert_file", "key_file"):
        path = root / HTTPS["tls_config"][key].lstrip("/")  # type: ignore[index]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(key)
    result = run(root, **HTTPS)
    assert not result.get("failed"), result
    pod = schedfiles.read(str(root / MANIFEST)).data
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"] for v in pod["spec"]["volumes"]}
    for key in ("ca_file", "cert_file", "key_file"):
        path = HTTPS["tls_config"][key]  # type: ignore[index]
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]] == {"path": path, "type": "File"}
    # back to plain HTTP: the TLS mounts go
    run(root)
    pod = schedfiles.read(str(root / MANIFEST)).data
    assert not [m for m in pod["spec"]["containers"][0]["volumeMounts"]
                if m["mountPath"].startswith("/etc/kubernetes/pki")]
    run(root, state="absent")
    assert (root / MANIFEST).read_bytes() == original


def test_relative_tls_file_is_refused(root: Path) -> None:
    bad = {**HTTPS, "tls_config": {"ca_file": "pki/ca.crt"}}
    result = run(root, **bad)
    assert result["failed"] and "tls_config.ca_file" in result["msg"]
    assert not (root / CONFIG).exists()


def test_absent_in_foreign_config_finds_our_entry_without_url_prefix(root: Path) -> None:
    theirs = with_foreign_config(root)
    manifest = (root / MANIFEST).read_bytes()
    run(root)
    removed = run_module(MODULE, {"host_root": str(root), "state": "absent"})
    assert removed["changed"], removed
    assert theirs.read_text() == FOREIGN
    assert (root / MANIFEST).read_bytes() == manifest


def test_absent_without_record_leaves_an_entry_that_looks_like_ours(root: Path) -> None:
    """A manifest without gpuk8s's record: an entry at our URL, or managing our resource,
    may be the administrator's own; it stays, with a warning that names it."""
    theirs = with_foreign_config(root)
    text = FOREIGN + "- urlPrefix: http://10.96.7.7:8080\n  filterVerb: filter\n" \
        "  managedResources:\n  - name: metax-tech.com/gpu\n"
    theirs.write_text(text)
    removed = run_module(MODULE, {"host_root": str(root), "state": "absent",
                                  "managed_resources": [{"name": "metax-tech.com/gpu"}]})
    assert not removed["changed"], removed
    plan = schedfiles.plan(schedfiles.Request(
        state="absent", spec=None, url_prefix=None, managed_resources=("metax-tech.com/gpu",),
        host_root=str(root)))
    assert any("the entry at http://10.96.7.7:8080 is left in place" in w
               for w in plan.warnings), plan
    assert theirs.read_text() == text


def test_changed_service_ip_replaces_the_old_entry(root: Path) -> None:
    theirs = with_foreign_config(root)
    run(root)
    moved = "http://10.96.0.99:8080"
    result = run(root, url_prefix=moved)
    assert result["changed"] and result["manifest_changed"]
    urls = [e["urlPrefix"] for e in schedfiles.read(str(theirs)).data["extenders"]]
    assert urls == ["http://127.0.0.1:9999", moved]
    assert marker_of(root)["urlPrefix"] == moved


def test_legacy_patch_without_marker_is_still_removed(root: Path) -> None:
    """Manifests patched before the marker: our config volume marks the flag as ours."""
    original = (root / MANIFEST).read_text()
    run(root)
    (root / MANIFEST).write_text((root / MANIFEST).read_text().replace(marker_lines(root), ""))
    # our --config names the file: still ours to change (a new weight), then to remove
    changed = run(root, weight=7)
    assert not changed.get("failed") and changed["changed"], changed.get("msg")
    (root / MANIFEST).write_text((root / MANIFEST).read_text().replace(marker_lines(root), ""))
    run(root, state="absent")
    assert (root / MANIFEST).read_text() == original
    assert not (root / CONFIG).exists()


def lab_manifest(root: Path) -> None:
    text = LAB_MANIFEST.read_text().replace("@IMAGE@", "registry.k8s.io/kube-scheduler:v1.35.4")
    (root / MANIFEST).write_text(text)


def test_kubernetes_version_is_checked_against_the_image(root: Path) -> None:
    """The lab's manifest (kube-scheduler v1.35.4): a 1.23 setting would write v1beta3,
    which that scheduler refuses at start."""
    lab_manifest(root)
    before = snapshot(root)
    result = run(root, kubernetes_version="1.23")
    assert result["failed"]
    assert "kubernetes_version '1.23' selects kubescheduler.config.k8s.io/v1beta3" in result["msg"]
    assert "v1.35.4" in result["msg"]
    assert snapshot(root) == before
    ok = run(root, kubernetes_version="v1.35.4")
    assert ok["api_version"] == "kubescheduler.config.k8s.io/v1"


def test_bind_verb_is_written_and_validated(root: Path) -> None:
    """GPU sharing: gpu-aware binds the pods it manages (bindVerb)."""
    result = run(root, bind_verb="bind", managed_resources=[{"name": "metax-tech.com/sgpu"}])
    assert not result.get("failed"), result
    config = schedfiles.read(str(root / CONFIG)).data
    assert config["extenders"][0]["bindVerb"] == "bind"
    bad = run(root, bind_verb="bind/../x")
    assert bad.get("failed") and "bind_verb" in bad["msg"]


def test_bind_verb_needs_managed_resources(root: Path) -> None:
    """gpu-aware's bind refuses pods without GPUs (issue 26): with no managedResources
    kube-scheduler would send it every pod to bind."""
    result = run(root, bind_verb="bind")
    assert result["failed"] and "bind_verb 'bind' needs managed_resources" in result["msg"]
    assert not (root / CONFIG).exists()


def test_the_entry_for_pods_without_gpus_follows_the_main_one(root: Path) -> None:
    """rank_pods_without_gpus: the second entry is written after ours, in our file and
    in the administrator's, moves with a changed URL, and goes with state=absent or when
    the option is turned off."""
    result = run(root, rank_pods_without_gpus=True)
    assert result["changed"] and not result.get("failed"), result
    verbs = [e["prioritizeVerb"] for e in schedfiles.read(str(root / CONFIG)).data["extenders"]]
    assert verbs == ["prioritize", schedconf.NOGPU_VERB]
    assert not run(root, rank_pods_without_gpus=True)["changed"]
    turned_off = run(root)
    assert turned_off["changed"] and turned_off["manifest_changed"]  # the scheduler restarts
    assert len(schedfiles.read(str(root / CONFIG)).data["extenders"]) == 1

    fresh = root.parent / "foreign"
    shutil.copytree(root.parent / "host", fresh)
    run(fresh, state="absent")
    theirs = with_foreign_config(fresh)
    original = theirs.read_text()
    assert run(fresh, rank_pods_without_gpus=True)["mode"] == "appended"
    entries = schedfiles.read(str(theirs)).data["extenders"]
    assert [(e["urlPrefix"], e.get("prioritizeVerb")) for e in entries][1:] == [
        (URL, "prioritize"), (URL, schedconf.NOGPU_VERB)]
    moved = "http://10.96.0.99:8080"
    assert run(fresh, url_prefix=moved, rank_pods_without_gpus=True)["changed"]
    entries = schedfiles.read(str(theirs)).data["extenders"]
    assert [e["urlPrefix"] for e in entries] == ["http://127.0.0.1:9999", moved, moved]
    assert run(fresh, state="absent", url_prefix=moved)["changed"]
    assert theirs.read_text() == original
