"""Chart values the install would refuse are refused at `helm template` time (issue 26).

Kubernetes-typed values (container `resources`, `tolerations`) are checked by the shared
schema definitions (charts/schema_fragments.py writes them into both charts' schemas);
what a schema cannot see -- two mounts of a container at one path, requests above limits,
payload image references -- by the charts' validations. Each bad value fails with a
message naming the field; the good ones render, and kubeconform (schemas of the lab's
Kubernetes, lab/schemas.sh) accepts what they render.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_charts import (  # noqa: F401 (kubeconform_schemas: a fixture)
    EXT,
    LAB_RELEASE,
    OP,
    OP_MIN,
    _deep_merge,
    assert_kubeconform_accepts,
    container,
    flags,
    kubeconform_schemas,
    objs,
    render_error,
    render_raw,
)

REPO = Path(__file__).resolve().parents[2]
FRAGMENTS = REPO / "charts" / "schema_fragments.py"
WORKLOADS = ("DaemonSet", "Deployment", "StatefulSet", "Job", "CronJob", "Pod")
DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"


def op(values: dict[str, Any]) -> dict[str, Any]:
    return _deep_merge(OP_MIN, values)


def tol(**fields: Any) -> dict[str, Any]:
    return {"tolerations": [fields]}


def res(component: str, **fields: Any) -> dict[str, Any]:
    return {component: {"resources": fields}}


# (id, chart, values, words the message must hold: the field first)
BAD = [
    # -- issue 26's four, in both charts where they apply
    ("log dir at device-plugins", EXT, {"gpuDevice": {"log": {"dir": DEVICE_PLUGINS}}},
     ["gpuDevice.log.dir", "device-plugins", DEVICE_PLUGINS, "two mounts at one path"]),
    ("log dir at device-plugins, op", OP, op({"log": {"dir": DEVICE_PLUGINS + "/"}}),
     ["gpuDevice.log.dir (or the global log.dir)", DEVICE_PLUGINS]),
    ("cpu=abc", EXT, res("gpuDevice", limits={"cpu": "abc"}),
     ["/gpuDevice/resources/limits/cpu", "'abc'"]),
    ("resources.foo", EXT, {"gpuLabel": {"resources": {"foo": 1}}},
     ["/gpuLabel/resources", "'foo' not allowed"]),
    ("tolerations[0].foo", EXT, tol(key="a", operator="Exists", foo="x"),
     ["/tolerations/0", "'foo' not allowed"]),
    ("tolerations[0].foo, op", OP, op(tol(key="a", foo="x")), ["/tolerations/0", "'foo'"]),
    # -- the same classes elsewhere: every mount a value sets
    ("log dir at /host", OP, op({"gpuExporter": {"log": {"dir": "/host"}}}),
     ["gpuExporter.log.dir", '"host-root"', "/host"]),
    ("maca log dir at /payload", OP, op({"maca": {"log": {"dir": "/payload"}}}),
     ["maca.log.dir", "container maca", "/payload"]),
    ("driver log dir at /payload", OP, op({"driver": {"log": {"dir": "/payload/"}}}),
     ["driver.log.dir", "container driver"]),
    ("runtime log dir at /host-system", OP, op({"runtime": {"log": {"dir": "/host-system"}}}),
     ["runtime.log.dir", "container-runtime"]),
    ("extra read path over /sys", EXT, {"hostPaths": {"extraReadPaths": ["/sys"]}},
     ["hostPaths.extraReadPaths[0]", "/host/sys"]),
    ("extra read path twice", EXT, {"hostPaths": {"extraReadPaths": ["/a/b", "/a/b"]}},
     ["hostPaths.extraReadPaths[0] or hostPaths.extraReadPaths[1]"]),
    ("runtime install dir at /etc/cdi", OP, op({"runtime": {"installDir": "/etc/cdi"}}),
     ["runtime.installDir", "/host-system/etc/cdi"]),
    ("containerd config in /usr/local/gpuk8s", OP,
     op({"runtime": {"containerd": {"config": "/usr/local/gpuk8s/config.toml"}}}),
     ["runtime.containerd.config", "runtime.installDir"]),
    # -- every resources value: quantities, names, requests within limits
    ("negative quantity", EXT, res("gpuAware", requests={"memory": "-1Mi"}),
     ["/gpuAware/resources/requests/memory"]),
    ("quantity with two suffixes", OP, op(res("driver", limits={"memory": "1Gi5"})),
     ["/driver/resources/limits/memory"]),
    ("quantity as a word", OP, op(res("operatorController", requests={"cpu": "half"})),
     ["/operatorController/resources/requests/cpu"]),
    ("bare resource name", EXT, res("gpuExporter", limits={"gpu": 1}),
     ["/gpuExporter/resources/limits", "'gpu' not allowed"]),
    ("resource claims", OP, op(res("maca", claims=[{"name": "gpu"}])),
     ["/maca/resources", "'claims' not allowed"]),
    ("requests above limits", EXT, res("gpuDevice", limits={"memory": "32Mi"}),
     ["gpuDevice.resources.requests.memory (64Mi) exceeds gpuDevice.resources.limits.memory"]),
    ("requests above limits, cpu", OP,
     op(res("runtime", requests={"cpu": "301m"}, limits={"cpu": "0.3"})),
     ["runtime.resources.requests.cpu (301m) exceeds runtime.resources.limits.cpu (0.3)"]),
    ("extended resource without limit", EXT, res("gpuMps", requests={"nvidia.com/gpu": 1}),
     ["gpuMps.resources.requests.nvidia.com/gpu needs gpuMps.resources.limits.nvidia.com/gpu"]),
    ("hugepages overcommitted", EXT,
     res("gpuLabel", requests={"hugepages-2Mi": "2Mi"}, limits={"hugepages-2Mi": "4Mi"}),
     ["gpuLabel.resources.requests.hugepages-2Mi (2Mi) must equal"]),
    # -- every toleration field, as the apiserver checks it
    ("toleration operator", EXT, tol(key="a", operator="Sometimes"),
     ["/tolerations/0/operator", "Equal", "Exists"]),
    ("toleration effect", OP, op(tol(key="a", effect="NoRun")),
     ["/tolerations/0/effect", "NoSchedule", "NoExecute"]),
    ("toleration without key must be Exists", EXT, tol(operator="Equal", value="x"),
     ["/tolerations/0/operator", "'Exists'"]),
    ("toleration Exists with a value", EXT, tol(key="a", operator="Exists", value="b"),
     ["/tolerations/0/value"]),
    ("tolerationSeconds without NoExecute", EXT,
     tol(key="a", effect="NoSchedule", tolerationSeconds=30), ["/tolerations/0/effect"]),
    ("toleration key", EXT, tol(key="a b", operator="Exists"), ["/tolerations/0/key"]),
    ("toleration value", EXT, tol(key="a", value="x y"), ["/tolerations/0/value"]),
    ("toleration seconds as text", EXT,
     tol(key="a", effect="NoExecute", tolerationSeconds="1m"),
     ["/tolerations/0/tolerationSeconds"]),
    # -- payload images: explicit tags (SPEC §5, §12), one registry
    ("maca image without tag", OP, op({"maca": {"payload": {"images": ["maca-c500"]}}}),
     ["maca.payload.images[0]", '"maca-c500" has no tag', "maca-c500:2.18.0.3"]),
    ("maca image with registry, without tag", OP,
     op({"maca": {"payload": {"images": ["maca-c500:1", "localhost:5000/cloud/maca"]}}}),
     ["maca.payload.images[1]", '"localhost:5000/cloud/maca" has no tag']),
    ("maca image empty tag", OP, op({"maca": {"payload": {"images": ["maca-c500:"]}}}),
     ["maca.payload.images[0]", "is not an image reference", "[REGISTRY/]NAME:TAG"]),
    ("maca image upper case", OP, op({"maca": {"payload": {"images": ["MACA:1"]}}}),
     ["maca.payload.images[0]", '"MACA:1" is not an image reference']),
    ("driver payload name", OP, op({"driver": {"payload": {"name": "Driver Image"}}}),
     ["/driver/payload/name"]),
]


@pytest.mark.parametrize(("chart", "values", "needles"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_values_are_refused_at_template_time(
    chart: Path, values: dict[str, Any], needles: list[str]
) -> None:
    err = render_error(chart, values)
    for needle in needles:
        assert needle in err, f"{needle!r} not in: {err}"


# (id, chart, values): each renders, and kubeconform accepts every object
GOOD = [
    ("quantities of every form", EXT, {
        "gpuDevice": {"resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                                    "limits": {"cpu": 0.5, "memory": "1.5Gi",
                                               "ephemeral-storage": "1e9"}}},
        "gpuLabel": {"resources": {"requests": {"cpu": 1, "memory": "48M",
                                                "hugepages-2Mi": "2Mi"},
                                   "limits": {"hugepages-2Mi": "2Mi", "cpu": "1"}}},
        "gpuAware": {"resources": {"requests": {"cpu": ".1", "memory": "+128Mi"},
                                   "limits": {"cpu": "100m", "memory": "134217728"}}},
        "deployExtenderGPUAware": True,
    }),
    ("extended resources, no requests", OP, op({
        "gpuExporter": {"resources": {"requests": None, "limits": {"example.com/widget": 2}}},
        "runtime": {"resources": {"requests": {"example.com/widget": 1},
                                  "limits": {"example.com/widget": 1}}},
    })),
    ("tolerations of every shape", EXT, {"tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
        {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 600},
        {"operator": "Exists"},
        {"key": "spot", "value": "", "effect": "PreferNoSchedule"},
    ]}),
    ("log dirs of their own", OP, op({
        "log": {"dir": "/var/log/metax/"},
        "gpuDevice": {"log": {"dir": "/var/lib/kubelet/device-plugins-logs"}},
        "maca": {"log": {"dir": "/var/log/maca"}},
        "hostPaths": {"extraReadPaths": ["/var/lib/gpuk8s-sim", "/sys/kernel"]},
    })),
    ("payload images with and without registry", OP, op({
        "registry": "harbor.example.com/metax",
        "driver": {"payload": {"name": "cr.metax-tech.com/cloud/driver-image"}},
        "maca": {"payload": {"images": [
            "cr.metax-tech.com/cloud/maca-c500:2.18",
            "localhost:5000/maca-c550:2.18.0.3-ubuntu22.04-amd64",
            "registry:5000/maca/n260:1",
            "maca-c500:2.18.0.3-ubuntu18.04-amd64",
            "metax/maca-c550:2.18",
        ]}},
    })),
]


@pytest.fixture(scope="module")
def kube_schemas(request: pytest.FixtureRequest) -> Path:
    """kubeconform schemas of the checkout's lab release (test_charts.LAB_RELEASE):
    lab/schemas.sh's (from the apiserver's own OpenAPI document) where it has made them on
    this machine, else those of kubernetes-validate for the same minor
    (test_charts.kubeconform_schemas), so the unit tier needs no apiserver."""
    made = Path(os.environ.get("GPUK8S_CACHE", "/var/cache/gpuk8s")) / "schemas"
    made /= f"kube-{LAB_RELEASE}"
    if (made / "daemonset-apps-v1.json").exists():
        # that release, not a running lab's other one (lab/versions.py: the variable wins)
        proc = subprocess.run(["bash", str(REPO / "lab" / "schemas.sh")], capture_output=True,
                              text=True, check=False,  # cached: prints the folder
                              env={**os.environ, "GPUK8S_KUBE_VERSION": LAB_RELEASE})
        assert proc.returncode == 0 and Path(proc.stdout.strip()) == made, proc.stderr
        return made
    return Path(request.getfixturevalue("kubeconform_schemas"))


@pytest.mark.parametrize(("chart", "values"), [g[1:] for g in GOOD], ids=[g[0] for g in GOOD])
def test_good_values_render_and_kubeconform_accepts_them(
    chart: Path, values: dict[str, Any], kube_schemas: Path, tmp_path: Path
) -> None:
    assert_kubeconform_accepts(chart, values, kube_schemas, tmp_path / "rendered.yaml")


def test_a_payload_image_with_a_registry_is_used_as_it_is() -> None:
    """maca.payload.images={cr.metax-tech.com/cloud/maca-c500:2.18} rendered as
    cr.metax-tech.com/cloud/cr.metax-tech.com/cloud/... before."""
    values = dict(GOOD[-1][2])
    ds = objs(OP, values).get("DaemonSet", "driver-manager")
    maca = container(ds, "maca")
    refs = [a.split("=", 1)[1] for a in maca["args"] if a.startswith("--payload-image=")]
    assert refs == [
        "cr.metax-tech.com/cloud/maca-c500:2.18",
        "localhost:5000/maca-c550:2.18.0.3-ubuntu22.04-amd64",
        "registry:5000/maca/n260:1",
        "harbor.example.com/metax/maca-c500:2.18.0.3-ubuntu18.04-amd64",
        "harbor.example.com/metax/metax/maca-c550:2.18",  # "metax" is a path, not a registry
    ]
    images = {c["name"]: c["image"] for c in ds["spec"]["template"]["spec"]["containers"]}
    assert [images[f"maca-payload-{i}"] for i in range(5)] == refs
    assert images["driver-payload"] == "cr.metax-tech.com/cloud/driver-image:2.0.0"
    assert flags(container(ds, "driver"))["payload-image"] == images["driver-payload"]


# -- the shared schema definitions, and what the mount check covers ------------------------
def test_schema_fragments_are_up_to_date() -> None:
    proc = subprocess.run([sys.executable, str(FRAGMENTS), "--check"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_a_stale_schema_is_noticed() -> None:
    sys.path.insert(0, str(FRAGMENTS.parent))
    try:
        import schema_fragments  # a script under charts/, not a package
    finally:
        sys.path.pop(0)
    text = (EXT / "values.schema.json").read_text()
    stale = json.loads(text)
    stale["$defs"]["quantity"] = {"type": "string"}
    stale_text = json.dumps(stale, indent=2, ensure_ascii=False) + "\n"
    assert schema_fragments.render(stale_text) == text


def _properties(node: Any, path: str = "") -> Any:
    """(path, name, schema) of every property of a schema, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for name, sub in value.items():
                    yield f"{path}/{name}", name, sub
            yield from _properties(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _properties(value, f"{path}/{i}")


@pytest.mark.parametrize("chart", [EXT, OP], ids=["ext", "op"])
def test_every_kubernetes_typed_value_uses_the_shared_definitions(chart: Path) -> None:
    schema = json.loads((chart / "values.schema.json").read_text())
    seen = set()
    for path, name, sub in _properties(schema):
        if path.startswith("/$defs"):
            continue
        if name == "resources":
            assert sub == {"$ref": "#/$defs/resources"}, path
        elif name == "tolerations":
            assert sub["items"] == {"$ref": "#/$defs/toleration"}, path
        elif name in ("affinity", "nodeSelector"):
            assert sub.get("$ref") == f"#/$defs/{name}", path
        elif name in ("securityContext", "podSecurityContext",
                      "env", "extraEnv", "volumes", "extraVolumes", "volumeMounts"):
            pytest.fail(f"{path}: a Kubernetes-typed value without a shared definition "
                        "(add one to charts/schema_fragments.py)")
        seen.add(name)
    assert {"resources", "tolerations", "affinity", "nodeSelector"} <= seen


def _checked_files(chart: Path) -> set[str]:
    text = (chart / "templates" / "validations.yaml").read_text()
    call = re.search(r'include "gpuk8s.checkMounts" \(dict "root" \. "files" \(list ([^)]*)\)',
                     text)
    assert call, "validations.yaml does not call gpuk8s.checkMounts"
    return set(re.findall(r'"([^"]+)"', call.group(1)))


@pytest.mark.parametrize(("chart", "values"), [
    (EXT, {"deployExtenderGPUAware": True, "gpuExporter": {"enabled": True}}),
    (OP, op({"deployExtenderGPUAware": True})),
], ids=["ext", "op"])
def test_every_template_with_pods_is_checked_for_mount_collisions(
    chart: Path, values: dict[str, Any]
) -> None:
    rc, out, err = render_raw(chart, values)
    assert rc == 0, err
    sources = set()
    for part in re.split(r"(?m)^---\s*$", out):
        source = re.search(r"(?m)^# Source: [^/]+/templates/(\S+)$", part)
        doc = yaml.safe_load(part)
        if source and isinstance(doc, dict) and doc.get("kind") in WORKLOADS:
            sources.add(source.group(1))
    assert sources and sources <= _checked_files(chart), sources - _checked_files(chart)
