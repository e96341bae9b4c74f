"""An NVIDIA container through the runtime wrapper and the real runc (issue 28 item 6).

container-runtime writes the CDI spec of a simulated 8xH100 node (driver files laid out as a
``.run --dkms`` install leaves them); the wrapper applies the device a pod was allocated to
a real OCI bundle (a Debian bookworm root, the lab's base image) and execs the real runc,
which runs the spec's hooks. Inside, the container has the driver's libraries in its ld.so
cache, ``nvidia-smi`` on its PATH, its one GPU and the control devices, and CUDA's
``libcuda.so.1`` loads by soname.

The simulator's kernel is its state directory: it is bind-mounted into the container here
(on a real node every container shares the kernel), so the simulated nvidia-smi and NVML
inside answer for the GPUs the container can reach.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.services.runtime.agent import RuntimeAgent, RuntimeSettings

REPO = Path(__file__).resolve().parents[2]
RUNC = shutil.which("runc") or "/usr/sbin/runc"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root"),
]

CHECK = (
    "set -e; ls /dev/nvidia*; echo ---; ldconfig -p | grep -E 'libcuda.so.1 |libnvidia-ml.so.1 '; "
    "echo ---; nvidia-smi -L; echo ---; "
    "nvidia-smi --query-gpu=uuid,compute_cap,driver_version --format=csv,noheader; echo ---; "
    "python3 -c 'import ctypes; ctypes.CDLL(\"libcuda.so.1\"); print(\"libcuda loaded\")'; "
    "nvidia-smi | grep -o 'Driver Version: [0-9.]*.*CUDA Version: [0-9.]*'"
)


class Reports:
    def publish(self, report: object) -> None:
        pass


@pytest.fixture(scope="module")
def base_rootfs() -> str:
    out = subprocess.run([str(REPO / "images/build.sh"), "base"], capture_output=True,
                         text=True, timeout=1800, check=True)
    return out.stdout.strip().splitlines()[-1]


def run_container(tmp_path: Path, tarball: str, root: str, spec_dir: Path, device: str,
                  script: str, wrapper: Path) -> subprocess.CompletedProcess[str]:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    subprocess.run(["tar", "-C", str(rootfs), "-xf", tarball], check=True)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    subprocess.run([RUNC, "spec", "--bundle", str(bundle)], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(rootfs), "readonly": False}
    config["process"]["terminal"] = False
    config["process"]["args"] = ["sh", "-c", script]
    config["annotations"] = {"cdi.k8s.io/gpuk8s": device}
    config["mounts"].append({"destination": "/var/lib/gpuk8s-sim", "type": "bind",
                             "source": f"{root}/var/lib/gpuk8s-sim", "options": ["rbind", "ro"]})
    (bundle / "config.json").write_text(json.dumps(config))
    wrapper_config = tmp_path / "wrapper.json"
    wrapper_config.write_text(json.dumps({"runtime": RUNC, "specDirs": [str(spec_dir)]}))
    env = {**os.environ, "GPUK8S_OCI_RUNTIME_CONFIG": str(wrapper_config)}
    name = f"gpuk8s-nv-{os.getpid()}-{tmp_path.name[-12:]}"
    try:
        return subprocess.run([str(wrapper), "--root", str(tmp_path / "runc"), "run",
                               "--bundle", str(bundle), name],
                              env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:
        subprocess.run([RUNC, "--root", str(tmp_path / "runc"), "delete", "-f", name],
                       capture_output=True, check=False)


def test_a_container_gets_cuda_through_the_wrapper_and_runc(
    tmp_path: Path, base_rootfs: str
) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "nvidia-8", device_nodes="char")
    install = tmp_path / "install"
    settings = RuntimeSettings(host_root=root, system_root="/", device_path_prefix=root,
                               cdi_dir=str(tmp_path / "cdi"), runtime="cdi",
                               install_dir=str(install), host_python=sys.executable)
    agent = RuntimeAgent(settings, Reports())  # type: ignore[arg-type]
    agent.write_spec()
    spec = json.loads((tmp_path / "cdi/nvidia.com-gpu.json").read_text())
    third = spec["devices"][2]["name"]  # the kubelet allocated the third GPU
    uuid = sim.state(root)["gpus"][2]["uuid"]
    proc = run_container(tmp_path, base_rootfs, root, tmp_path / "cdi",
                         f"nvidia.com/gpu={third}", CHECK, install / "bin/gpuk8s-oci-runtime")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nodes, cache, listing, query, rest = proc.stdout.split("---\n")
    assert set(nodes.split()) == {"/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                  "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in cache
    assert "libnvidia-ml.so.1 (libc6,x86-64)" in cache
    assert listing.strip() == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuid})"
    assert query.strip() == f"{uuid}, 9.0, 550.54.15"
    assert "libcuda loaded" in rest
    assert "Driver Version: 550.54.15" in rest and "CUDA Version: 12.4" in rest


def test_without_the_driver_files_nvidia_smi_is_missing(tmp_path: Path, base_rootfs: str) -> None:
    """The same container with only the device nodes (what the spec held before): no
    nvidia-smi, no libcuda - the failure issue 28 item 6 describes."""
    root = str(tmp_path / "node")
    sim.create(root, "nvidia-8", device_nodes="char")
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    from gpuk8s.core.cdi import build_spec
    from gpuk8s.discovery import discover

    spec = build_spec(discover(root), host_prefix=root)
    (spec_dir / "nvidia.com-gpu.json").write_text(json.dumps(spec))
    shutil.copytree(REPO / "src", tmp_path / "src")  # the wrapper from source, no hooks used
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, "
                       f"{str(tmp_path / 'src')!r})\nfrom gpuk8s.host.ociwrapper import main\n"
                       "sys.exit(main())\n")
    wrapper.chmod(0o755)
    proc = run_container(tmp_path, base_rootfs, root, spec_dir,
                         f"nvidia.com/gpu={spec['devices'][0]['name']}",
                         "ls /dev/nvidia0; nvidia-smi -L", wrapper)
    assert proc.returncode != 0
    assert "nvidia-smi: not found" in proc.stderr
