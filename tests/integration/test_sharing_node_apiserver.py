"""Issue 14, node side, against a real kube-apiserver: gpu-label publishes the driver's
CUDA version, gpu-aware (node cache fed by a real watch) keeps a pod stating a newer
CUDA runtime off that node, and gpu-mps follows the node's sharing-mode label."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.cuda import MAJOR_LABEL, MINOR_LABEL, RUNTIME_ANNOTATION
from gpuk8s.core.sharing import SHARING_MODE_LABEL
from gpuk8s.host.mps import PID_FILE
from gpuk8s.services.extender.main import build_parser, build_service
from gpuk8s.services.labeller.main import main as labeller_main
from gpuk8s.services.mps.main import main as mps_main

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]


@pytest.fixture(scope="module")
def nvidia_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = str(tmp_path_factory.mktemp("nv") / "node")
    with pytest.MonkeyPatch.context() as mp:  # the stand-in tools start with this python
        mp.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
        sim.create(root, "nvidia-8")
        yield root


def post(port: int, verb: str, payload: Any) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", f"/{verb}", body=json.dumps(payload).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    return resp.status, data


def test_cuda_labels_and_the_runtime_check(apiserver: Any, nvidia_root: str,
                                           wait_until: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    fresh, old = f"nv-{tag}-fresh", f"nv-{tag}-old"
    core = apiserver.core()
    core.create_node({"metadata": {"name": fresh}})
    core.create_node({"metadata": {"name": old, "labels": {MAJOR_LABEL: "11", MINOR_LABEL: "8"}}})
    # gpu-label with only get/patch on nodes publishes what NVML says (12.4)
    assert labeller_main(["--node-name", fresh, "--host-root", nvidia_root, "--once",
                          "--kubeconfig", apiserver.kubeconfig("gpu-label"),
                          "--log-level", "error"]) == 0
    labels = core.read_node(fresh).metadata.labels
    assert (labels[MAJOR_LABEL], labels[MINOR_LABEL]) == ("12", "4")

    args = build_parser().parse_args(
        ["--port", "0", "--address", "127.0.0.1", "--node-cache",
         "--kubeconfig", apiserver.kubeconfig("gpu-aware"), "--log-level", "warning"])
    service = build_service(args)
    service.start()
    try:
        cuda = service.extender.cuda
        wait_until(lambda: cuda.get(fresh) is not None and cuda.get(old) is not None, 30,
                 "the node watch")
        pod = {"metadata": {"name": "train", "namespace": "default", "uid": "u1",
                            "annotations": {RUNTIME_ANNOTATION: "12.2"}},
               "spec": {"containers": [{"name": "m",
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        status, result = post(service.port, "filter", {"Pod": pod, "NodeNames": [fresh, old]})
        assert status == 200 and result["NodeNames"] == [fresh]
        reason = result["FailedAndUnresolvableNodes"][old]
        assert "CUDA 11.8" in reason and "runtime 12.2" in reason
        # the old node's driver is upgraded and relabelled: the watch lets the pod in
        core.patch_node(old, {"metadata": {"labels": {MAJOR_LABEL: "12", MINOR_LABEL: "6"}}})
        wait_until(lambda: str(cuda.get(old)) == "12.6", 30, "the relabelled node")
        status, result = post(service.port, "filter", {"Pod": pod, "NodeNames": [fresh, old]})
        assert result["NodeNames"] == [fresh, old]
    finally:
        service.close()
        core.delete_node(fresh)
        core.delete_node(old)


def test_gpu_mps_follows_the_sharing_mode_label(apiserver: Any, nvidia_root: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    node = f"nv-{uuid.uuid4().hex[:6]}-mps"
    core = apiserver.core()
    core.create_node({"metadata": {"name": node}})
    mps_dir = tempfile.mkdtemp(prefix="mps", dir="/tmp")  # short: socket path limit
    argv = ["--node-name", node, "--host-root", nvidia_root, "--mps-dir", mps_dir, "--once",
            "--kubeconfig", apiserver.kubeconfig("gpu-label"), "--log-dir", "",
            "--log-level", "error"]
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
            assert mps_main(argv) == 0  # no label: exclusive, nothing runs
            assert json.loads(capsys.readouterr().out)["running"] == 0
            core.patch_node(node, {"metadata": {"labels": {SHARING_MODE_LABEL: "mps"}}})
            assert mps_main(argv) == 0
            started = json.loads(capsys.readouterr().out)
            assert started["mode"] == "mps" and started["running"] == 8
            assert len(list(Path(mps_dir).glob(f"*/pipe/{PID_FILE}"))) == 8
            core.patch_node(node, {"metadata": {"labels": {SHARING_MODE_LABEL: "vcuda"}}})
            assert mps_main(argv) == 0
            stopped = json.loads(capsys.readouterr().out)
            assert stopped["running"] == 0 and len(stopped["stopped"]) == 8
            assert not list(Path(mps_dir).glob(f"*/pipe/{PID_FILE}"))
    finally:
        for pid_file in Path(mps_dir).glob(f"*/pipe/{PID_FILE}"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        shutil.rmtree(mps_dir, ignore_errors=True)
        core.delete_node(node)
