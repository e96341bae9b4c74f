"""The accelerator manual's NVIDIA host procedure (issue 27 item 6): prerequisite checks
that name what is missing, the driver install from NVIDIA's .run with DKMS and rollback,
and the simulator's stand-ins for the installer, dkms and apt-get behaving as the real ones
where they can be judged."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.discovery.tools import default_runner
from gpuk8s.host import containercheck, serving
from gpuk8s.host import nvidia_checks as checks
from gpuk8s.host import nvidia_driver as driver

pytestmark = pytest.mark.usefixtures("fast_python3")

NEW, OLD = "550.54.15", "470.256.02"


def runner(argv: list[str]) -> tuple[int, str, str]:
    return default_runner(argv, timeout=120)


def tool(root: Path, rel: str, output: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)


@pytest.fixture(scope="module")
def installers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = str(tmp_path_factory.mktemp("payload"))
    return {v: sim.write_nvidia_installer(v, out) for v in (NEW, OLD)}


def node(tmp_path: Path, preset: str, installers: dict[str, str] | None = None) -> str:
    root = tmp_path / "node"
    sim.create(str(root), preset)
    for path in (installers or {}).values():
        (root / "home/gpu").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / "home/gpu")
    return str(root)


def failed(facts: checks.HostFacts, wants: checks.Wants) -> dict[str, str]:
    return {c.name: c.message for c in checks.evaluate(facts, wants) if not c.ok}


# ------------------------------------------------------------------------------ checks


def test_a_node_ready_for_everything_passes_every_check(tmp_path: Path) -> None:
    root = node(tmp_path, "nvidia-8")
    system = tmp_path / "system"
    tool(system, "usr/bin/containerd", "containerd github.com/containerd/containerd 1.6.20 x")
    tool(system, "usr/bin/python3", "Python 3.10.12")
    tool(system, "usr/bin/kubelet", "Kubernetes v1.29.4")
    (system / "etc/kubernetes/manifests").mkdir(parents=True)
    (system / "etc/kubernetes/manifests/kube-apiserver.yaml").write_text(
        "spec:\n  containers:\n  - command:\n    - kube-apiserver\n    - --allow-privileged=true\n")
    facts = checks.gather(root, runner, system_root=str(system))
    assert facts.kubernetes_version == "1.29.4" and facts.containerd_version == "1.6.20"
    assert facts.nvidia_smi.driver_version == NEW and facts.nvidia_smi.gpus == 8
    assert facts.kernel == "5.15.0-91-generic" and facts.gcc and facts.dkms
    assert facts.kernel_headers and facts.os_id == "ubuntu"
    wants = checks.Wants("operator", "gpuk8s", mps=True, cuda_runtime="12.4")
    results = checks.evaluate(facts, wants)
    assert [c.name for c in results] == list(checks.CHECKS)
    assert all(c.ok for c in results), [c for c in results if not c.ok]


def test_each_missing_prerequisite_is_named(tmp_path: Path) -> None:
    root = node(tmp_path, "p100-4")  # Pascal, driver 470 (CUDA 11.4)
    facts = checks.gather(root, runner, kubernetes_version="v1.24.3")
    wants = checks.Wants("operator", "toolkit", mps=True, cuda_runtime="12.4")
    why = failed(facts, wants)
    assert "Kubernetes 1.24.3 is older than 1.25" in why["kubernetes"]
    assert "NVIDIA Container Toolkit not installed" in why["container_toolkit"]
    assert why["mps"] == "MPS needs a Volta or newer GPU (compute capability >= 7.0); GPU 0 " \
           "(Tesla P100-PCIE-16GB) has 6.0"
    assert "supports CUDA 11.4, older than" in why["cuda"] and "runtime 12.4" in why["cuda"]
    assert "CUDA_ERROR_UNKNOWN (999)" in why["cuda"]
    assert "needs containerd >= 1.5.0" in why["container_runtime"]
    assert set(why) == {"kubernetes", "container_toolkit", "mps", "cuda", "container_runtime"}
    # a Volta GPU with an old driver: MPS names the driver instead
    volta = replace(facts, gpus=tuple({**g, "compute_capability": "7.0"} for g in facts.gpus))
    assert failed(volta, wants)["mps"] == ("MPS needs a driver for CUDA >= 11.5; this driver "
                                           "supports CUDA 11.4")


def test_no_gpu_no_driver_and_a_disabled_device_plugin_gate(tmp_path: Path) -> None:
    root = node(tmp_path, "nvidia-8-nodriver")
    (Path(root) / "var/lib/kubelet").mkdir(parents=True)
    (Path(root) / "var/lib/kubelet/config.yaml").write_text(
        "featureGates:\n  DevicePlugins: false\n")
    facts = checks.gather(root, runner, kubernetes_version="1.25.0")
    why = failed(facts, checks.Wants())
    assert why["nvidia_smi"].startswith("nvidia-smi not found on the node")
    assert "DevicePlugins feature gate is turned off" in why["device_plugins"]
    assert not facts.gcc and not facts.dkms and not facts.kernel_headers
    empty = tmp_path / "empty"
    sim.create(str(empty), "nogpu")
    why = failed(checks.gather(str(empty), runner, kubernetes_version="1.30"), checks.Wants())
    assert why["nvidia_gpu"].startswith("no NVIDIA GPU on the PCI bus")


def test_operator_scheme_runtime_os_and_privileged(tmp_path: Path) -> None:
    root = node(tmp_path, "nvidia-8")
    facts = checks.gather(root, runner, kubernetes_version="1.23.17")
    wants = checks.Wants("operator")
    docker = replace(facts, docker_version="20.10.24")
    assert "container_runtime" not in failed(docker, wants)  # docker with Kubernetes 1.23
    assert "container_runtime" in failed(replace(docker, kubernetes_version="1.25.0"), wants)
    assert "containerd 1.4.3" in failed(replace(facts, containerd_version="1.4.3"), wants)[
        "container_runtime"]
    debian = replace(facts, os_id="debian", os_version="12")
    assert failed(debian, wants)["host_os"].startswith("host OS debian 12 is not one")
    assert "host_os" not in failed(replace(facts, os_id="centos", os_version="9"), wants)
    closed = replace(facts, apiserver_allow_privileged=False)
    assert "--allow-privileged=true" in failed(closed, wants)["allow_privileged"]
    # the extensions scheme does not ask for them
    assert not {"container_runtime", "host_os", "allow_privileged"} & set(
        failed(debian, checks.Wants("extensions")))


def test_toolkit_versions(tmp_path: Path) -> None:
    root = node(tmp_path, "nvidia-8")
    tool(Path(root), "usr/bin/nvidia-ctk", "NVIDIA Container Toolkit CLI version 1.6.0")
    wants = checks.Wants(runtime="toolkit")
    facts = checks.gather(root, runner, kubernetes_version="1.30")
    assert failed(facts, wants)["container_toolkit"] == \
        "NVIDIA Container Toolkit 1.6.0 is older than 1.7.0"
    tool(Path(root), "usr/bin/nvidia-ctk", "NVIDIA Container Toolkit CLI version 1.14.3")
    facts = checks.gather(root, runner, kubernetes_version="1.30")
    assert "container_toolkit" not in failed(facts, wants)


def test_bad_wishes_are_refused() -> None:
    for bad in ({"scheme": "both"}, {"runtime": "docker"}, {"cuda_runtime": "12"}):
        with pytest.raises(checks.ConfigError):
            checks.Wants(**bad)  # type: ignore[arg-type]
    with pytest.raises(checks.ConfigError, match="allowed are"):
        checks.evaluate(checks.gather("/nonexistent", runner), checks.Wants(), ["gpu"])


# ------------------------------------------------------------------------------ driver


def test_driver_install_as_the_manual_does(tmp_path: Path, installers: dict[str, str]) -> None:
    root = node(tmp_path, "nvidia-8-nodriver", installers)
    request = driver.DriverRequest(f"/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run")
    plan = driver.plan(root, request, runner)
    assert plan.install and plan.version == NEW and plan.gpus == 8
    assert plan.missing == ("gcc", "dkms", "linux-headers-5.15.0-91-generic")
    assert Path(plan.package_argv[0]).name == "apt-get"
    assert plan.actions[1] == f"run NVIDIA-Linux-x86_64-{NEW}.run --dkms --silent"
    assert not os.access(f"{root}/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run", os.X_OK)
    outcome = driver.converge(root, request, runner)
    assert outcome.changed and outcome.after == NEW
    assert os.access(f"{root}/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run", os.X_OK)  # chmod a+x
    dkms = subprocess.run([f"{root}/usr/sbin/dkms", "status"], capture_output=True, text=True,
                          check=True).stdout
    assert f"nvidia/{NEW}, 5.15.0-91-generic, x86_64: installed" in dkms
    again = driver.plan(root, request, runner)
    assert not again.install and again.installed == NEW
    assert not os.path.exists(f"{root}{driver.JOURNAL}")


def test_a_driver_that_does_not_drive_the_gpus_is_rolled_back(
    tmp_path: Path, installers: dict[str, str]
) -> None:
    """470 loads but does not support Hopper: nvidia-smi finds no device; the node goes back
    to 550 through its installer."""
    root = node(tmp_path, "nvidia-8", installers)
    bad = driver.DriverRequest(f"/home/gpu/NVIDIA-Linux-x86_64-{OLD}.run",
                               previous_installer=f"/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run")
    with pytest.raises(driver.NvidiaDriverError) as caught:
        driver.converge(root, bad, runner)
    assert "No devices were found" in str(caught.value)
    assert f"rolled back to driver {NEW}" in str(caught.value)
    assert caught.value.actions == [
        f"run NVIDIA-Linux-x86_64-{OLD}.run --dkms --silent", "check nvidia-smi",
        "roll back: nvidia-uninstall --silent",
        f"roll back: reinstall NVIDIA-Linux-x86_64-{NEW}.run"]
    status = checks.nvidia_smi_status(root, runner)
    assert status.ok and status.driver_version == NEW and status.gpus == 8
    # without a previous installer the failed driver still goes, and the message says so
    with pytest.raises(driver.NvidiaDriverError, match="give previous_installer"):
        driver.converge(root, replace(bad, previous_installer=None), runner)
    assert not checks.nvidia_smi_status(root, runner).ok


def test_nothing_changes_when_the_build_cannot_start(
    tmp_path: Path, installers: dict[str, str]
) -> None:
    root = node(tmp_path, "nvidia-8-nodriver", installers)
    request = driver.DriverRequest(f"/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run",
                                   packages=("gcc", "dkms", "linux-headers-6.1.0-99-amd64"))
    with pytest.raises(driver.NvidiaDriverError) as caught:
        driver.converge(root, request, runner)
    assert "Unable to locate package linux-headers-6.1.0-99-amd64" in str(caught.value)
    assert not os.path.exists(f"{root}/usr/bin/nvidia-smi")
    assert not os.path.exists(f"{root}{driver.JOURNAL}")
    # the installer itself refuses without headers, with NVIDIA's message
    run = subprocess.run([sys_python(), f"{root}/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run",
                          "--dkms", "--silent"], capture_output=True, text=True, check=False)
    assert run.returncode == 1 and "Unable to find the system utility `cc`" in run.stderr
    subprocess.run([f"{root}/usr/bin/apt-get", "install", "-y", "gcc", "dkms"], check=True,
                   capture_output=True)
    run = subprocess.run([sys_python(), f"{root}/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run",
                          "--dkms"], capture_output=True, text=True, check=False)
    assert run.returncode == 1 and "Unable to find the kernel source tree" in run.stderr


def sys_python() -> str:
    return shutil.which("python3") or "python3"


def test_refusals_before_anything_is_touched(tmp_path: Path, installers: dict[str, str]) -> None:
    root = node(tmp_path, "nogpu", installers)
    with pytest.raises(driver.NvidiaDriverError, match="no NVIDIA GPU on the PCI bus"):
        driver.plan(root, driver.DriverRequest(f"/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run"),
                    runner)
    with pytest.raises(driver.NvidiaDriverError, match="not found on the node"):
        driver.plan(root, driver.DriverRequest("/home/gpu/NVIDIA-Linux-x86_64-1.2.3.run"), runner)
    with pytest.raises(checks.ConfigError, match="does not match the installer"):
        driver.DriverRequest(f"/x/NVIDIA-Linux-x86_64-{NEW}.run", version="535.1").wanted()
    with pytest.raises(checks.ConfigError, match="give version"):
        driver.DriverRequest("/x/driver.run").wanted()
    # the stand-in installer never installs outside a simulated root
    run = subprocess.run([sys_python(), installers[NEW], "--dkms"], capture_output=True,
                         text=True, check=False)
    assert run.returncode == 1 and "installs only into a simulated root" in run.stderr


def test_el_nodes_get_kernel_devel(tmp_path: Path) -> None:
    root = node(tmp_path, "nvidia-8-nodriver")
    (Path(root) / "etc/os-release").write_text('ID="centos"\nVERSION_ID="9"\nID_LIKE="rhel"\n')
    missing, kernel = driver.required_packages(root, dkms=True)
    assert missing == ("gcc", "dkms", f"kernel-devel-{kernel}")
    with pytest.raises(driver.NvidiaDriverError, match="no package manager"):
        driver.package_command(root)
    tool(Path(root), "usr/bin/yum", "yum")
    assert Path(driver.package_command(root)[0]).name == "yum"


def test_an_interrupted_install_is_finished_by_the_next_run(
    tmp_path: Path, installers: dict[str, str]
) -> None:
    root = node(tmp_path, "nvidia-8", installers)
    # the process died after running the 470 installer, before checking nvidia-smi
    subprocess.run([sys_python(), f"{root}/home/gpu/NVIDIA-Linux-x86_64-{OLD}.run", "--dkms",
                    "--silent"], check=True, capture_output=True)
    journal = Path(f"{root}{driver.JOURNAL}")
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text(json.dumps({
        "version": OLD, "previous": NEW, "installer": f"/home/gpu/NVIDIA-Linux-x86_64-{OLD}.run",
        "previousInstaller": f"/home/gpu/NVIDIA-Linux-x86_64-{NEW}.run", "dkms": True,
        "gpus": 8}))
    message = driver.recover(root, runner)
    assert message is not None and f"rolled back to driver {NEW}" in message
    assert not journal.exists() and checks.nvidia_smi_status(root, runner).driver_version == NEW
    assert driver.recover(root, runner) is None


def test_nvidia_smi_in_a_container_output_is_read(tmp_path: Path) -> None:
    text = ("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |\n"
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: x)\n")
    result = containercheck.parse_output(0, text)
    assert (result.driver_version, result.cuda_version, result.gpus) == (NEW, "12.4", 2)
    config = containercheck.bundle_config({"process": {"args": ["sh"]}, "mounts": []}, "/r",
                                          ["nvidia.com/gpu=all"], "nvidia-smi", [("/a", "/b")])
    assert config["annotations"] == {"cdi.k8s.io/gpuk8s": "nvidia.com/gpu=all"}
    assert config["mounts"] == [{"destination": "/b", "type": "bind", "source": "/a",
                                 "options": ["rbind", "ro"]}]
    (tmp_path / "bin").mkdir()  # a directory is not the wrapper
    with pytest.raises(containercheck.ContainerCheckError, match="not installed"):
        containercheck.run_check(wrapper=str(tmp_path / "bin"), rootfs=str(tmp_path),
                                 devices=[], runner=runner, work_dir=str(tmp_path / "work"))
    tool(tmp_path, "bin/wrapper", "")
    with pytest.raises(containercheck.ContainerCheckError, match="host's own root"):
        containercheck.run_check(wrapper=str(tmp_path / "bin/wrapper"), rootfs="/", devices=[],
                                 runner=runner, work_dir=str(tmp_path / "work"),
                                 runc=str(tmp_path / "bin/wrapper"))
    assert not (tmp_path / "work").exists()


def test_the_container_check_leaves_no_directory_it_made(tmp_path: Path) -> None:
    """Its work directory goes again when the check made it, and stays when it was there."""
    runc = tmp_path / "bin/runc"
    runc.parent.mkdir()
    runc.write_text('#!/bin/sh\n[ "$1" = spec ] || exit 0\n'
                    'echo \'{"process": {"args": ["sh"]}, "mounts": []}\' > "$3/config.json"\n')
    runc.chmod(0o755)
    tool(tmp_path, "bin/wrapper", "Driver Version: 550.54.15   CUDA Version: 12.4\n"
                                  "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)")
    (tmp_path / "rootfs/bin").mkdir(parents=True)
    for work, there in ((tmp_path / "var/nvidia-check", False), (tmp_path / "own", True)):
        if there:
            work.mkdir()
        result = containercheck.run_check(
            wrapper=str(tmp_path / "bin/wrapper"), rootfs=str(tmp_path / "rootfs"),
            devices=["nvidia.com/gpu=all"], runner=runner, work_dir=str(work), runc=str(runc))
        assert (result.driver_version, result.gpus) == (NEW, 1)
        assert work.exists() == there and not (there and any(work.iterdir()))
    assert (tmp_path / "var").is_dir()  # only the directory it made


def test_the_running_kubelet_and_containerd_are_found_before_path(tmp_path: Path) -> None:
    """A node's kubelet or containerd running from outside PATH (RKE2's, a containerd 2.x
    beside the distribution's 1.x) is the one asked for its version."""
    proc = tmp_path / "proc"
    for pid, comm, exe in ((40, "containerd-shim", "/usr/bin/shim"), (7, "bash", "/bin/bash"),
                           (300, "kubelet", "/var/lib/rancher/rke2/bin/kubelet"),
                           (120, "containerd", "/opt/containerd-2.4/containerd")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        (proc / str(pid) / "exe").symlink_to(exe)
    (proc / "self").mkdir()
    assert checks.running_program("/", "kubelet", str(proc)) == [
        "/var/lib/rancher/rke2/bin/kubelet"]
    assert checks.running_program("/", "containerd", str(proc)) == [
        "/opt/containerd-2.4/containerd"]
    assert checks.running_program("/", "dockerd", str(proc)) == []
    # another root's processes are not this machine's
    assert checks.running_program(str(tmp_path), "kubelet", str(proc)) == []


def test_the_containerd_asked_is_the_one_serving_the_socket(tmp_path: Path) -> None:
    """A process named containerd that does not serve the node's socket (the distribution's
    1.x beside the 2.x the node runs) is not the one asked: the checks and the runtime agent
    find containerd the same way, by the socket's peer (host.serving); the name is only the
    fallback where no socket answers."""
    system = tmp_path / "sys"
    proc = tmp_path / "proc"
    (proc / "120").mkdir(parents=True)  # named containerd, serves nothing
    (proc / "120/comm").write_text("containerd\n")
    (proc / "120/exe").symlink_to("/usr/bin/containerd")
    tool(tmp_path, "containerd-2.4", "containerd github.com/containerd/containerd/v2 v2.4.2 x")
    (proc / str(os.getpid())).mkdir()  # this test serves the socket
    (proc / str(os.getpid()) / "exe").symlink_to(tmp_path / "containerd-2.4")
    tool(system, "usr/bin/containerd", "containerd github.com/containerd/containerd 1.6.20 x")
    (system / "run").mkdir()
    served = str(proc / str(os.getpid()) / "exe")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(system / "run/c.sock"))
        server.listen(4)
        assert serving.serving_program(str(system / "run/c.sock"), str(proc)) == (
            os.getpid(), served)
        assert checks.daemon_program(str(system), "containerd", "/run/c.sock", str(proc)) == \
            served
        # by name alone, on the host itself, the other one
        assert checks.running_program("/", "containerd", str(proc)) == ["/usr/bin/containerd"]
        facts = checks.gather(str(tmp_path / "none"), runner, system_root=str(system),
                              kubernetes_version="1.30", containerd_socket="/run/c.sock")
        # gather reads the real /proc: the program serving the socket is this Python, and
        # that is the one asked for its version, not containerd 1.6.20 under the root
        assert facts.containerd_version == "{}.{}.{}".format(*sys.version_info[:3])
    # nothing serves the socket: the fallback (under this root: PATH's containerd)
    assert serving.serving_program(str(system / "run/c.sock"), str(proc)) is None
    assert checks.daemon_program(str(system), "containerd", "/run/c.sock", str(proc)) == \
        str(system / "usr/bin/containerd")
