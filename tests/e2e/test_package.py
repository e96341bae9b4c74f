"""Issue 7 test 7 (package half): the offline package against the lab's real registry and
containerd. Builds the package from the images lab/up built (build/images/images.txt),
pushes every image with the `.run` script, loads them into containerd under another
registry name, and pushes both charts with `helm push`."""

from __future__ import annotations

import json
import subprocess
import tarfile
import urllib.request
from pathlib import Path

import pytest

from .conftest import HELM, KUBECONFIG, REGISTRY, REPO, run

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("lab")]
pytestmark.append(
    pytest.mark.skipif(
        not (REPO / "package" / "build.sh").exists(), reason="not delivered yet: package/build.sh"
    )
)

IMAGES_TXT = REPO / "build" / "images" / "images.txt"


def version() -> str:
    for line in IMAGES_TXT.read_text().splitlines():
        ref = line.split()[1]
        if "/gpu-device:" in ref:
            return ref.rsplit(":", 1)[1]
    raise AssertionError(f"no gpu-device image in {IMAGES_TXT}: run lab/up (component images)")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pkg")
    run(
        str(REPO / "package" / "build.sh"),
        version(),
        "--images",
        str(IMAGES_TXT),
        "--out",
        str(out),
        timeout=900,
    )
    tarball = out / f"metax-gpu-k8s-package.{version()}.tar.gz"
    assert tarball.exists(), list(out.iterdir())
    with tarfile.open(tarball) as tar:  # the manual: mkdir k8s; tar -C k8s -xvzf ...
        tar.extractall(out / "k8s", filter="data")
    return out / "k8s"


def catalog() -> list[str]:
    with urllib.request.urlopen(f"http://{REGISTRY}/v2/_catalog?n=1000", timeout=5) as resp:
        return json.load(resp)["repositories"]


def test_run_push_puts_every_image_in_the_registry(package: Path) -> None:
    script = package / f"metax-k8s-images.{version()}.run"
    run("bash", str(script), "push", f"{REGISTRY}/e2e-pkg", "--dest-tls-verify=false", timeout=900)
    repos = catalog()
    for name in ("gpu-device", "gpu-label", "gpu-aware", "gpu-exporter"):
        assert f"e2e-pkg/{name}" in repos, repos


def test_run_load_imports_into_containerd(package: Path) -> None:
    script = package / f"metax-k8s-images.{version()}.run"
    run(
        "bash", str(script), "load", "e2e-load.example/cloud", "--engine", "containerd", timeout=900
    )
    names = subprocess.run(
        ["ctr", "-n", "k8s.io", "images", "ls", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert f"e2e-load.example/cloud/gpu-device:{version()}" in names


def test_helm_push_of_both_charts(package: Path) -> None:
    for chart in sorted(package.glob("metax-*.tgz")):
        run(
            HELM,
            "--kubeconfig",
            KUBECONFIG,
            "push",
            str(chart),
            f"oci://{REGISTRY}/e2e-charts",
            "--plain-http",
        )
    repos = catalog()
    assert "e2e-charts/metax-gpu-extensions" in repos, repos
    assert "e2e-charts/metax-operator" in repos, repos
