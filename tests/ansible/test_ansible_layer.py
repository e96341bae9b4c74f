"""The Ansible layer end to end on localhost: real ansible / ansible-playbook / molecule.

* a module importing ``ansible.module_utils.gpuk8s...`` runs under a Python that does
  not have gpuk8s installed (AnsiballZ ships the files from ``src/``);
* every host-side module's four-step proof through ansible-playbook;
* the molecule scenarios that need no cluster (converge -> idempotence -> verify).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s import sim

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SYSTEM_PYTHON = "/usr/bin/python3"
SAMPLE_MANIFEST = REPO / "tests/ansible/data/kube-scheduler.yaml"
pytestmark = pytest.mark.slow


def env() -> dict[str, str]:
    out = dict(os.environ)
    # The simulator's tools start with `#!/usr/bin/env python3`; ansible's programs live here.
    out["PATH"] = f"{BIN}:{out.get('PATH', '')}"
    out["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    out["ANSIBLE_NOCOLOR"] = "1"
    out.pop("PYTHONPATH", None)
    return out


def has_gpuk8s(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import gpuk8s"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.fixture
def sim_root(tmp_path: Path) -> Path:
    root = tmp_path / "sim"
    sim.create(str(root), "c500-8")
    return root


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no /usr/bin/python3")
def test_module_runs_under_a_python_without_gpuk8s(sim_root: Path) -> None:
    assert not has_gpuk8s(SYSTEM_PYTHON), "the point is a Python without gpuk8s"
    proc = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={SYSTEM_PYTHON}",
         "-m", "gpu_facts", "-a", f"host_root={sim_root} topology=false", "-o"],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    payload = json.loads(proc.stdout.split("=>", 1)[1])
    facts = payload["ansible_facts"]["gpuk8s"]
    assert facts["gpu_count"] == 8
    assert facts["labels"]["metax-tech.com/gpu.product"] == "C500"


def host_vars(where: Path, host_python: str, yaml_python: str) -> dict[str, str]:
    """A simulated GPU node, a copy of a control plane and a driver payload under
    ``where``: the variables of tests/ansible/playbooks/modules_on_sim.yml for one host."""
    sim_root = where / "sim"
    sim.create(str(sim_root), "c500-8")
    cp_root = where / "cp"
    (cp_root / "etc/kubernetes/manifests").mkdir(parents=True)
    shutil.copy(SAMPLE_MANIFEST, cp_root / "etc/kubernetes/manifests/kube-scheduler.yaml")
    payload = where / "payload"
    sim.write_payload("driver", "2.33.0.6", str(payload))
    return {
        "gpuk8s_sim_root": str(sim_root),
        "gpuk8s_cp_root": str(cp_root),
        "gpuk8s_payload": str(payload),
        "gpuk8s_host_python": host_python,
        "gpuk8s_yaml_python": yaml_python,
        # runs the simulator's modprobe stand-in (any Python 3)
        "gpuk8s_standin_python": sys.executable,
    }


def test_modules_four_steps_through_ansible_playbook(tmp_path: Path) -> None:
    host_python = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    extra = host_vars(tmp_path, host_python, sys.executable)
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", json.dumps(extra),
         str(REPO / "tests/ansible/playbooks/modules_on_sim.yml")],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "failed=0" in proc.stdout
    # absent gave back the original bytes
    manifest = tmp_path / "cp/etc/kubernetes/manifests/kube-scheduler.yaml"
    assert manifest.read_bytes() == SAMPLE_MANIFEST.read_bytes()


@pytest.mark.skipif(shutil.which("molecule", path=str(BIN)) is None,
                    reason="molecule not installed")
@pytest.mark.parametrize("scenario", ["gpu_virtualization", "gpu_aware", "nvidia_host"])
def test_molecule_scenario(scenario: str) -> None:
    proc = subprocess.run(
        [str(BIN / "molecule"), "test", "-s", scenario],
        cwd=REPO, env={**env(), "GPUK8S_PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=900, check=False,
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    assert proc.returncode == 0, output[-6000:]
    for step in ("prepare", "converge", "idempotence", "verify"):
        assert f"{scenario} ➜ {step}: Executed: Successful" in output, output[-6000:]


def test_metax_docker_role_four_steps(tmp_path: Path) -> None:
    """check -> changed, nothing installed; apply -> changed; check and apply again ->
    unchanged; the same for state absent. The installed wrapper runs."""
    version = "1.2.3"
    subprocess.run([sys.executable, str(REPO / "package/metax_docker.py"), version,
                    "--out", str(tmp_path)], check=True, capture_output=True, timeout=120)
    prefix = tmp_path / "prefix"
    target = prefix / "bin/metax-docker"
    host_python = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable

    def play(state: str, check: bool = False) -> int:
        extra = {
            "metax_docker_version": version,
            "metax_docker_package": str(tmp_path / f"metax-docker_{version}.tar"),
            "metax_docker_prefix": str(prefix),
            "metax_docker_state": state,
            "metax_docker_python": host_python,
            "ansible_python_interpreter": sys.executable,
        }
        proc = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
             "-e", json.dumps(extra), *(["--check"] if check else []),
             str(REPO / "tests/ansible/playbooks/metax_docker_role.yml")],
            cwd=REPO, env=env(), capture_output=True, text=True, timeout=300, check=False,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        found = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", proc.stdout)
        assert found, proc.stdout[-2000:]
        return int(found.group(1))

    assert play("present", check=True) == 1 and not target.exists()
    assert play("present") == 1 and target.exists()
    assert play("present", check=True) == 0
    assert play("present") == 0
    proc = subprocess.run([str(target), "run", "--gpus", "0", "img"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "at least one GPU" in proc.stderr
    assert play("absent", check=True) == 1 and target.exists()
    assert play("absent") == 1 and not target.exists()
    assert play("absent") == 0


def nvidia_role_vars(tmp_path: Path, preset: str) -> dict[str, object]:
    """A simulated NVIDIA node, the stand-in driver installer and scratch runtime paths."""
    root = tmp_path / "node"
    sim.create(str(root), preset)
    payload = sim.write_nvidia_installer("550.54.15", str(tmp_path / "payload"))
    scratch = tmp_path / "system"
    (scratch / "etc/containerd").mkdir(parents=True)
    (scratch / "etc/containerd/config.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
        '  default_runtime_name = "runc"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '  runtime_type = "io.containerd.runc.v2"\n')
    return {
        "ansible_python_interpreter": sys.executable,
        "nvidia_host_root": str(root),
        "nvidia_host_kubernetes_version": "1.30.2",
        "nvidia_host_driver_src": payload,
        "nvidia_host_containerd_config": str(scratch / "etc/containerd/config.toml"),
        "nvidia_host_containerd_restart": "none",
        # no containerd serves the scratch system (the host's own, if any, is not asked)
        "nvidia_host_containerd_socket": str(scratch / "run/containerd/containerd.sock"),
        "nvidia_host_cdi_dir": str(scratch / "etc/cdi"),
        "nvidia_host_install_dir": str(scratch / "usr/local/gpuk8s"),
        "nvidia_host_device_path_prefix": str(root),
        "nvidia_host_check_container": False,
    }


def nvidia_play(extra: dict[str, object], check: bool = False
                ) -> tuple[subprocess.CompletedProcess[str], int]:
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", json.dumps(extra), *(["--check"] if check else []),
         str(REPO / "tests/ansible/playbooks/nvidia_host_role.yml")],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=600, check=False,
    )
    found = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", proc.stdout)
    return proc, int(found.group(1)) if found else -1


def changed_lines(out: str) -> Iterator[tuple[str, str]]:
    """(task, host) for each ``changed: [host]`` line of an ansible-playbook run (default
    callback), in order; a delegated task's ``[host -> delegate]`` counts for its host."""
    task = ""
    for line in out.splitlines():
        header = re.match(r"TASK \[(.*)\] \**$", line)
        if header:
            task = header.group(1)
        changed = re.match(r"changed: \[([^\]\s]+)", line)
        if changed:
            yield task, changed.group(1)


def changed_tasks(out: str) -> list[str]:
    """The tasks of an ansible-playbook run (default callback) that reported changed."""
    found: list[str] = []
    for task, _host in changed_lines(out):
        if task not in found:
            found.append(task)
    return found


def changed_by_host(out: str) -> dict[str, list[str]]:
    """Per host, the tasks of an ansible-playbook run that reported changed on it."""
    found: dict[str, list[str]] = {}
    for task, host in changed_lines(out):
        if task not in found.setdefault(host, []):
            found[host].append(task)
    return found


def test_nvidia_host_role_four_steps(tmp_path: Path) -> None:
    """check -> the tasks that would change, nothing installed; apply -> exactly those
    tasks change; check and apply again -> unchanged; the same for the undo."""
    extra = nvidia_role_vars(tmp_path, "nvidia-8-nodriver")
    root = Path(str(extra["nvidia_host_root"]))
    config = (tmp_path / "system/etc/containerd/config.toml").read_text()
    proc, changed = nvidia_play(extra, check=True)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    predicted = changed_tasks(proc.stdout)
    assert changed == len(predicted) == 4, predicted
    assert not (root / "home/gpu").exists() and not (root / "usr/bin/nvidia-smi").exists()
    assert not (tmp_path / "system/etc/cdi").exists()
    assert (tmp_path / "system/etc/containerd/config.toml").read_text() == config
    proc, changed = nvidia_play(extra)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert changed_tasks(proc.stdout) == predicted and changed == 4
    assert (tmp_path / "system/etc/cdi/nvidia.com-gpu.json").exists()
    assert 'default_runtime_name = "nvidia"' in (
        tmp_path / "system/etc/containerd/config.toml").read_text()
    assert "containerd is not running" in re.sub(r"\s+", " ", proc.stdout + proc.stderr)  # warned
    for check in (True, False):
        proc, changed = nvidia_play(extra, check=check)
        assert proc.returncode == 0 and changed == 0, proc.stdout[-5000:]
        assert changed_tasks(proc.stdout) == []
    # the undo: check names the one task the run changes; containerd's config back byte for
    # byte, the spec and the wrapper's directory gone; then nothing left to do
    undo = {**extra, "nvidia_host_state": "absent"}
    proc, _ = nvidia_play(undo, check=True)
    assert changed_tasks(proc.stdout) == [
        "nvidia_host : Remove the CDI spec, the wrapper and the runtime handler"], proc.stdout
    assert (tmp_path / "system/etc/cdi/nvidia.com-gpu.json").exists()
    proc, _ = nvidia_play(undo)
    assert proc.returncode == 0 and changed_tasks(proc.stdout) == [
        "nvidia_host : Remove the CDI spec, the wrapper and the runtime handler"], proc.stdout
    assert (tmp_path / "system/etc/containerd/config.toml").read_text() == config
    assert not (tmp_path / "system/usr/local/gpuk8s").exists()
    assert sorted(p.name for p in (tmp_path / "system/etc").rglob("*")) == [
        "cdi", "config.toml", "containerd"]  # no spec, no backup of the config
    for check in (True, False):
        proc, changed = nvidia_play(undo, check=check)
        assert proc.returncode == 0 and changed == 0, proc.stdout[-5000:]


def test_nvidia_host_role_names_what_is_missing(tmp_path: Path) -> None:
    """A Pascal node asked for MPS and CUDA 12.4: the role fails on each, by name."""
    extra = {**nvidia_role_vars(tmp_path, "p100-4"), "nvidia_host_mps": True,
             "nvidia_host_cuda_runtime": "12.4"}
    del extra["nvidia_host_driver_src"]  # the node keeps its 470 driver
    proc, _ = nvidia_play(extra)
    assert proc.returncode != 0
    out = re.sub(r"\s+", " ", proc.stdout)
    assert "mps: MPS needs a Volta or newer GPU (compute capability >= 7.0)" in out
    assert "cuda: the node's NVIDIA driver supports CUDA 11.4, older than" in out
