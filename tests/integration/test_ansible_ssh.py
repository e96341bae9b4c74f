"""The roles over real SSH, as administrators run them: a private sshd on 127.0.0.1
(tests/sshd.py), a non-root user with key-only login, ``become`` through real sudo and
interpreter discovery on the node (no ``ansible_python_interpreter``).

Check mode honesty: each role runs with ``--check --diff``, then for real; the tasks the
check reported changed are exactly the tasks the real run changed, and a second check and
a second real run change nothing. Every path is a scratch copy (a simulated GPU root, a
copy of a control plane's kube-scheduler manifest, a scratch containerd config): nothing on
this host outside the temp dirs changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from tests import sshd
from tests.ansible.test_ansible_layer import (
    BIN,
    REPO,
    SAMPLE_MANIFEST,
    changed_tasks,
    env,
    nvidia_role_vars,
)

pytestmark = pytest.mark.integration
PLAYBOOK = REPO / "tests/ansible/playbooks/ssh_roles.yml"
GROUPS = ("kube_control_plane", "gpu_nodes", "registry")


@pytest.fixture(scope="module")
def node() -> Iterator[sshd.Sshd]:
    why = sshd.missing()
    if why:
        pytest.skip(why)
    with sshd.private_sshd() as server:
        yield server


def play(inventory: Path, extra: dict[str, Any], check: bool = False
         ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "-e", json.dumps(extra),
         *(["--check", "--diff"] if check else []), str(PLAYBOOK)],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return proc, changed_tasks(proc.stdout)


def honest(inventory: Path, extra: dict[str, Any]) -> list[str]:
    """check -> real -> check -> real; returns the tasks the first two reported changed."""
    _, predicted = play(inventory, extra, check=True)
    _, done = play(inventory, extra)
    assert sorted(done) == sorted(predicted), f"check said {predicted}, the real run changed {done}"
    for check in (True, False):
        _, again = play(inventory, extra, check=check)
        assert again == [], f"{'check' if check else 'real'} run after the real one changed {again}"
    return done


def test_the_node_is_reached_as_a_user_with_sudo(node: sshd.Sshd) -> None:
    """What the other tests rely on: the login user is not root, sudo makes it root, and
    interpreter discovery finds the node's Python."""
    inventory = node.inventory(GROUPS)
    assert node.ssh("id -un").stdout.strip() == sshd.USER
    proc = subprocess.run(
        [str(BIN / "ansible"), "-i", str(inventory), "all", "-b", "-m", "ansible.builtin.command",
         "-a", "id -un"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300,
        check=False)
    assert proc.returncode == 0 and re.search(r"\broot\b", proc.stdout), proc.stdout + proc.stderr
    assert "ansible_python_interpreter" not in inventory.read_text()  # discovery decides


def test_scheduler_and_vf_roles_check_mode_predicts_the_real_run(
        node: sshd.Sshd, tmp_path: Path) -> None:
    """gpu_aware on a copy of a control plane (url given: no API server needed) and
    gpu_virtualization on a simulated SR-IOV node, both over SSH with become."""
    os.chmod(tmp_path, 0o755)
    control = tmp_path / "cp"
    (control / "etc/kubernetes/manifests").mkdir(parents=True)
    shutil.copy(SAMPLE_MANIFEST, control / "etc/kubernetes/manifests/kube-scheduler.yaml")
    manifest = (control / "etc/kubernetes/manifests/kube-scheduler.yaml").read_bytes()
    gpus = tmp_path / "sim"
    sim.create(str(gpus), "c500-8-vf4")
    extra = {
        "gpuk8s_test_roles": ["gpu_aware", "gpu_virtualization"],
        "gpu_aware_url_prefix": "http://10.96.0.20:8080",
        "gpu_aware_tls": False,
        "gpu_aware_wait_for_scheduler": False,
        "gpu_aware_host_root": str(control),
        "gpu_aware_backup": False,  # backups would go to the host's /var/lib/gpuk8s
        "gpu_virtualization_host_root": str(gpus),
        "gpu_virtualization_vfnum": 2,
        "gpu_virtualization_wait": False,
    }
    inventory = node.inventory(GROUPS)
    done = honest(inventory, extra)
    assert set(done) == {"gpu_aware : Configure the scheduler extender",
                         "gpu_virtualization : Set the VFs on the host"}, done
    extender = control / "etc/metax/extender.yaml"
    assert "http://10.96.0.20:8080" in extender.read_text()
    assert extender.stat().st_uid == 0  # written through sudo, not as the login user
    numvfs = sorted(gpus.glob("sys/bus/pci/devices/*/sriov_numvfs"))
    assert numvfs and {p.read_text().strip() for p in numvfs} == {"2"}
    # and back: disabling restores the administrator's manifest byte for byte
    extra.update({"gpuk8s_test_roles": ["gpu_aware"], "gpu_aware_state": "absent"})
    assert honest(inventory, extra) == ["gpu_aware : Configure the scheduler extender"]
    assert (control / "etc/kubernetes/manifests/kube-scheduler.yaml").read_bytes() == manifest


def test_nvidia_host_role_check_mode_predicts_the_real_run(node: sshd.Sshd, tmp_path: Path) -> None:
    """nvidia_host over SSH: the driver installer is copied from the controller, the CDI
    spec, wrapper and containerd config edit land on the node through sudo."""
    os.chmod(tmp_path, 0o755)
    extra: dict[str, Any] = {**nvidia_role_vars(tmp_path, "nvidia-8-nodriver"),
                             "gpuk8s_test_roles": ["nvidia_host"]}
    del extra["ansible_python_interpreter"]  # the node's own, found by discovery
    config = tmp_path / "system/etc/containerd/config.toml"
    before = config.read_text()
    _, predicted = play(node.inventory(GROUPS), extra, check=True)
    assert config.read_text() == before and not (tmp_path / "system/etc/cdi").exists()
    done = honest(node.inventory(GROUPS), extra)
    assert sorted(done) == sorted(predicted) and len(done) == 4, done
    assert 'default_runtime_name = "nvidia"' in config.read_text()
    assert (tmp_path / "system/etc/cdi/nvidia.com-gpu.json").stat().st_uid == 0
