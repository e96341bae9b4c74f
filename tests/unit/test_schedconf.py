"""core.schedconf: pure planning on plain dicts (no YAML library involved)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuk8s.core import schedconf as sc
from gpuk8s.core.errors import ConfigError, ManifestError

URL = "http://10.96.0.50:8080"


def manifest(extra_args: tuple[str, ...] = (), kubeconfig_mounted: bool = True) -> dict[str, Any]:
    mounts = [{"mountPath": "/etc/kubernetes/scheduler.conf", "name": "kubeconfig",
               "readOnly": True}] if kubeconfig_mounted else []
    volumes = [{"hostPath": {"path": "/etc/kubernetes/scheduler.conf", "type": "FileOrCreate"},
                "name": "kubeconfig"}] if kubeconfig_mounted else []
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
        "spec": {
            "containers": [{
                "name": "kube-scheduler",
                "image": "registry.k8s.io/kube-scheduler:v1.29.3",
                "command": ["kube-scheduler", "--kubeconfig=/etc/kubernetes/scheduler.conf",
                            "--leader-elect=true", *extra_args],
            }],
        },
    }
    if kubeconfig_mounted:  # a manifest without mounts has no such keys at all
        pod["spec"]["containers"][0]["volumeMounts"] = mounts
        pod["spec"]["volumes"] = volumes
    return pod


@pytest.mark.parametrize(
    ("version", "api"),
    [
        ("v1.22.17", "v1beta2"),
        ("1.23", "v1beta3"),
        ("v1.24.0", "v1beta3"),
        ("v1.25.0", "v1"),
        ("1.29.3", "v1"),
        ("v1.35.4", "v1"),
        ("v1.30.0-rc.1", "v1"),
    ],
)
def test_api_version_follows_the_cluster(version: str, api: str) -> None:
    assert sc.api_version_for(version) == f"kubescheduler.config.k8s.io/{api}"


@pytest.mark.parametrize("version", ["v1.21.9", "2.0", "latest", ""])
def test_unsupported_or_garbage_versions_are_refused(version: str) -> None:
    with pytest.raises(ConfigError, match="kubernetes_version"):
        sc.api_version_for(version)


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("registry.k8s.io/kube-scheduler:v1.29.3", "v1.29.3"),
        ("127.0.0.1:5000/kube-scheduler:v1.35.4", "v1.35.4"),
        ("registry.k8s.io/kube-scheduler:v1.28.1@sha256:abcd", "v1.28.1"),
        ("127.0.0.1:5000/kube-scheduler", None),
        ("registry.k8s.io/kube-scheduler:latest", None),
    ],
)
def test_version_from_image_tag(image: str, tag: str | None) -> None:
    assert sc.version_from_image(image) == tag


def test_defaults_render_spec_section_7() -> None:
    assert sc.ExtenderSpec(URL).to_yaml() == {
        "urlPrefix": URL,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 500,
        "enableHTTPS": False,
        "nodeCacheCapable": False,
        "ignorable": False,
    }
    config = sc.new_config(sc.ExtenderSpec(URL), sc.api_version_for("1.29"))
    assert config["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    sc.check_config(config, "x")


def test_packing_profile_lets_the_extender_rank_every_feasible_node() -> None:
    config = sc.new_config(sc.ExtenderSpec(URL), sc.api_version_for("1.35"))
    assert config["percentageOfNodesToScore"] == 100
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "default-scheduler"
    (fit,) = profile["pluginConfig"]
    assert fit == {"name": "NodeResourcesFit", "args": {"scoringStrategy": {
        "type": "MostAllocated", "resources": [{"name": "metax-tech.com/gpu", "weight": 1}]}}}
    plain = sc.new_config(sc.ExtenderSpec(URL), sc.api_version_for("1.35"), profile="none")
    assert "profiles" not in plain and "percentageOfNodesToScore" not in plain
    assert plain["extenders"] == config["extenders"]
    with pytest.raises(ConfigError, match="scheduler_profile"):
        sc.new_config(sc.ExtenderSpec(URL), sc.api_version_for("1.35"), profile="spread")


def test_second_manual_variant_renders_every_field() -> None:
    spec = sc.ExtenderSpec(
        "https://10.96.0.1/api/v1/namespaces/ns/services/gpu-aware:8080/proxy",
        filter_verb="predicates",
        enable_https=True,
        tls_config=sc.TlsConfig(insecure=False, ca_file="/pki/ca.crt", cert_file="/pki/c.crt",
                                key_file="/pki/c.key"),
        http_timeout="30s",
        managed_resources=(sc.ManagedResource("metax-tech.com/gpu"),),
    )
    spec.validate()
    out = spec.to_yaml()
    assert out["filterVerb"] == "predicates"
    assert out["tlsConfig"] == {"insecure": False, "certFile": "/pki/c.crt",
                                "keyFile": "/pki/c.key", "caFile": "/pki/ca.crt"}
    assert out["httpTimeout"] == "30s"
    assert out["managedResources"] == [{"name": "metax-tech.com/gpu",
                                        "ignoredByScheduler": False}]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (sc.ExtenderSpec(URL, weight=0), "weight"),
        (sc.ExtenderSpec(URL, weight=-3), "weight"),
        (sc.ExtenderSpec("10.96.0.50:8080"), "url_prefix"),
        (sc.ExtenderSpec(URL, enable_https=True), "enable_https"),
        (sc.ExtenderSpec("https://x:8080"), "enable_https"),
        (sc.ExtenderSpec(URL, tls_config=sc.TlsConfig()), "tls_config"),
        (sc.ExtenderSpec(URL, filter_verb=None, prioritize_verb=None), "filter_verb"),
        (sc.ExtenderSpec(URL, filter_verb="a/b"), "filter_verb"),
        (sc.ExtenderSpec(URL, http_timeout="30"), "http_timeout"),
        (sc.ExtenderSpec(URL, managed_resources=(sc.ManagedResource("r"),
                                                 sc.ManagedResource("r"))), "managed_resources"),
    ],
)
def test_invalid_extenders_name_the_field(spec: sc.ExtenderSpec, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        spec.validate()


def test_filter_only_extender_may_have_zero_weight() -> None:
    sc.ExtenderSpec(URL, prioritize_verb=None, weight=0).validate()


def test_patch_adds_flag_mount_and_volume_once() -> None:
    pod = manifest()
    changes = sc.patch_manifest(pod)
    container = pod["spec"]["containers"][0]
    assert container["command"][-1] == "--config=/etc/metax/extender.yaml"
    assert {"mountPath": "/etc/metax/extender.yaml", "name": sc.VOLUME_CONFIG,
            "readOnly": True} in container["volumeMounts"]
    assert {"hostPath": {"path": "/etc/metax/extender.yaml", "type": "File"},
            "name": sc.VOLUME_CONFIG} in pod["spec"]["volumes"]
    # kubeadm already mounts the kubeconfig: not a second time
    assert [m["mountPath"] for m in container["volumeMounts"]].count(
        "/etc/kubernetes/scheduler.conf") == 1
    assert len(changes) == 3
    again = copy.deepcopy(pod)
    assert sc.patch_manifest(again) == []
    assert again == pod


def test_patch_mounts_the_kubeconfig_when_nothing_does() -> None:
    pod = manifest(kubeconfig_mounted=False)
    sc.patch_manifest(pod)
    volumes = {v["name"]: v["hostPath"] for v in pod["spec"]["volumes"]}
    assert volumes[sc.VOLUME_KUBECONFIG] == {"path": "/etc/kubernetes/scheduler.conf",
                                             "type": "FileOrCreate"}
    assert sc.patch_manifest(pod) == []


@pytest.mark.parametrize("mounted", [True, False])
def test_unpatch_removes_exactly_what_patch_added(mounted: bool) -> None:
    original = manifest(kubeconfig_mounted=mounted)
    pod = copy.deepcopy(original)
    sc.patch_manifest(pod)
    assert sc.unpatch_manifest(pod)
    assert pod == original
    assert sc.unpatch_manifest(pod) == []


def test_patch_refuses_a_foreign_config_flag() -> None:
    with pytest.raises(ManifestError, match=r"--config=/etc/kubernetes/sched\.yaml"):
        sc.patch_manifest(manifest(("--config=/etc/kubernetes/sched.yaml",)))


@pytest.mark.parametrize(
    "args", [("--config=/a/b.yaml",), ("--config", "/a/b.yaml")]
)
def test_configured_path_both_spellings(args: tuple[str, ...]) -> None:
    container = manifest(args)["spec"]["containers"][0]
    assert sc.configured_path(container) == "/a/b.yaml"


def test_host_path_through_a_directory_mount() -> None:
    pod = manifest(("--config=/config/sched.yaml",))
    assert sc.host_path_of(pod, "/config/sched.yaml") is None
    pod["spec"]["containers"][0]["volumeMounts"].append({"mountPath": "/config", "name": "c"})
    pod["spec"]["volumes"].append({"name": "c", "hostPath": {"path": "/srv/sched",
                                                             "type": "Directory"}})
    assert sc.host_path_of(pod, "/config/sched.yaml") == "/srv/sched/sched.yaml"
    assert sc.host_path_of(pod, "/etc/kubernetes/scheduler.conf") == (
        "/etc/kubernetes/scheduler.conf")
    assert sc.host_path_of(pod, "/elsewhere/x") is None


def test_upsert_appends_after_existing_extenders_and_updates_in_place() -> None:
    theirs = {"urlPrefix": "http://other:9000", "filterVerb": "filter", "weight": 1}
    config: dict[str, Any] = {"apiVersion": "kubescheduler.config.k8s.io/v1",
                              "kind": "KubeSchedulerConfiguration", "extenders": [theirs]}
    assert sc.upsert_extender(config, sc.ExtenderSpec(URL))
    assert config["extenders"][0] == theirs
    assert config["extenders"][1]["urlPrefix"] == URL
    assert not sc.upsert_extender(config, sc.ExtenderSpec(URL))
    assert sc.upsert_extender(config, sc.ExtenderSpec(URL, weight=7))
    assert [e["weight"] for e in config["extenders"]] == [1, 7]
    assert sc.remove_extender(config, URL + "/")
    assert config["extenders"] == [theirs]
    assert not sc.remove_extender(config, URL)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"apiVersion": "v1", "kind": "ConfigMap"}, "is not a"),
        ({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
          "extenders": [{"urlPrefix": "u", "prioritizeVerb": "p", "weight": 0}]},
         "positive weight"),
        ({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
          "extenders": [{"urlPrefix": "a", "bindVerb": "bind"},
                        {"urlPrefix": "b", "bindVerb": "bind"}]}, "one extender may have"),
        ({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
          "extenders": [{"urlPrefix": "a", "managedResources": [{"name": "x"}, {"name": "x"}]}]},
         "repeats"),
        ("just a string", "not a YAML mapping"),
    ],
)
def test_check_config_rejects_what_kube_scheduler_would(config: Any, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        sc.check_config(config, "f.yaml")


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"kind": "Deployment"}, "expected Pod"),
        ({"kind": "Pod", "spec": {"containers": []}}, "missing or empty"),
        ({"kind": "Pod", "spec": {"containers": [{"name": "etcd", "command": ["etcd"]}]}},
         "no container named"),
        (["a", "list"], "not a YAML mapping"),
    ],
)
def test_scheduler_container_errors(pod: Any, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        sc.scheduler_container(pod)


def test_the_entry_for_pods_without_gpus_is_prioritize_only_and_ignorable() -> None:
    """``rank_nogpu``: a second entry of the same extender that kube-scheduler asks
    about every pod (no managedResources), which can neither filter, bind nor hold a
    pod up (ignorable), at the main entry's weight and transport settings."""
    spec = sc.ExtenderSpec(
        URL, bind_verb="bind", node_cache_capable=True, http_timeout="5s", rank_nogpu=True,
        managed_resources=(sc.ManagedResource("metax-tech.com/gpu"),),
    )
    spec.validate()
    config = sc.new_config(spec, sc.api_version_for("1.35"))
    main, nogpu = config["extenders"]
    assert main == spec.to_yaml() and main["managedResources"]
    assert nogpu == {"urlPrefix": URL, "prioritizeVerb": sc.NOGPU_VERB, "weight": 500,
                     "enableHTTPS": False, "httpTimeout": "5s", "nodeCacheCapable": True,
                     "ignorable": True}
    sc.check_config(config, "x")  # one binder, weights positive
    assert sc.new_config(sc.ExtenderSpec(URL), sc.api_version_for("1.35"))["extenders"] == [
        sc.ExtenderSpec(URL).to_yaml()]  # off by default in the spec
    with pytest.raises(ConfigError, match="rank_nogpu"):
        sc.ExtenderSpec(URL, prioritize_verb=sc.NOGPU_VERB).validate()
    with pytest.raises(ConfigError, match="weight"):
        sc.ExtenderSpec(URL, prioritize_verb=None, weight=0, rank_nogpu=True).validate()


def test_upsert_and_remove_handle_both_entries() -> None:
    theirs = {"urlPrefix": "http://other:9000", "filterVerb": "filter", "weight": 1}
    config: dict[str, Any] = {"apiVersion": "kubescheduler.config.k8s.io/v1",
                              "kind": "KubeSchedulerConfiguration", "extenders": [theirs]}
    assert sc.upsert_extender(config, sc.ExtenderSpec(URL, rank_nogpu=True))
    assert [e.get("prioritizeVerb") for e in config["extenders"]] == [
        None, "prioritize", sc.NOGPU_VERB]
    assert not sc.upsert_extender(config, sc.ExtenderSpec(URL, rank_nogpu=True))
    assert sc.upsert_extender(config, sc.ExtenderSpec(URL, weight=9, rank_nogpu=True))
    assert [e["weight"] for e in config["extenders"]] == [1, 9, 9]
    assert sc.upsert_extender(config, sc.ExtenderSpec(URL, weight=9))  # turned off: it goes
    assert [e.get("prioritizeVerb") for e in config["extenders"]] == [None, "prioritize"]
    assert sc.upsert_extender(config, sc.ExtenderSpec(URL, rank_nogpu=True))
    assert sc.remove_extender(config, URL)
    assert config["extenders"] == [theirs]
