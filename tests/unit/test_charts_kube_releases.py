"""Both charts render for every Kubernetes release the lab runs (lab/versions.env
``KUBE_VERSIONS``: 1.35.4 and 1.37.2) and every object they render is valid for that
release's API (kubernetes-validate's strict schemas of the same minor), gpu-dra and its
DeviceClasses included (issue 51 item 1). docs/compatibility.md states the range.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_charts import CLUSTER, EXT, NS, OP, OP_MIN, REL, VAP_API, _deep_merge, run_helm

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))
import versions as lab_versions  # noqa: E402  (lab/versions.py)

sys.path.remove(str(REPO / "lab"))

RELEASES = lab_versions.read()["KUBE_VERSIONS"].split(",")
DRA = {"gpuDra": {"enabled": True, "groupDevices": True}, "deployExtenderGPUAware": True}
CHARTS = [("ext-dra", EXT, DRA), ("op-dra", OP, _deep_merge(OP_MIN, DRA))]


def validation_errors(docs: list[dict[str, Any]], release: str) -> list[str]:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    errors = []
    for doc in docs:
        try:
            kv.validate(doc, release.lstrip("v"), strict=True)
        except kv.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {err.message}")
        except kv.SchemaNotFoundError as err:
            errors.append(f"{doc['apiVersion']} {doc['kind']}: {err.message}")
    return errors


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name,chart,values", CHARTS, ids=[c[0] for c in CHARTS])
def test_renders_valid_objects_for_the_release(
    release: str, name: str, chart: Path, values: dict[str, Any]
) -> None:
    # as `helm install` renders on a cluster of that release (which serves VAPs: >= 1.30)
    proc = run_helm(["template", REL, str(chart), "-n", NS, "--kube-version", release,
                     "--api-versions", VAP_API], _deep_merge(CLUSTER, values))
    assert proc.returncode == 0, f"{name} on {release}: {proc.stderr}"
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "DeviceClass", "ValidatingAdmissionPolicy"} <= kinds, kinds
    assert not validation_errors(docs, release), "\n".join(validation_errors(docs, release))


@pytest.mark.parametrize("release", RELEASES)
def test_validation_can_fail_for_the_release(release: str) -> None:
    """A DeviceClass with a field resource.k8s.io/v1 does not have is refused."""
    bad = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
           "metadata": {"name": "x"}, "spec": {"selectors": [], "driverName": "x"}}
    assert validation_errors([bad], release)
