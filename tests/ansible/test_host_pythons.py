"""The host side under every supported host Python, and a clear error below 3.8.

Managed hosts run the modules of ``library/`` (and the ``core``, ``discovery`` and
``ansible`` code AnsiballZ ships with them) under their own Python: Ubuntu 20.04 has
3.8, CentOS 9 / OpenEuler 22.03 3.9, Ubuntu 22.04 3.10. The interpreters come from
``GPUK8S_HOST_PYTHONS`` (space-separated), which ``scripts/host-pythons`` sets to its
cached venvs of pyenv's 3.8-3.12 (holding pytest and ruamel.yaml, not gpuk8s) before it
runs this file (``-m host_pythons``; the unit tier leaves it out).

* every module, four steps each, through one ``ansible-playbook`` run with one local
  host per interpreter (they run side by side);
* a module run under 3.6 / 3.7 (and 2.7) fails with a message saying Python >= 3.8 is
  needed instead of AnsiballZ's SyntaxError.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from test_ansible_layer import BIN, REPO, SAMPLE_MANIFEST, env, host_vars

from gpuk8s import sim

pytestmark = [pytest.mark.slow, pytest.mark.host_pythons]

SUPPORTED = ("3.8", "3.9", "3.10", "3.11", "3.12")
TOO_OLD = ("2.7", "3.6", "3.7")
PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"


def pyenv_python(minor: str) -> str | None:
    found = sorted(PYENV.glob(f"{minor}.*/bin/python"))
    return str(found[-1]) if found else None


def version_of(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


def host_pythons() -> dict[str, str]:
    """Version -> interpreter for every supported host Python."""
    listed = os.environ.get("GPUK8S_HOST_PYTHONS", "").split()
    assert listed, "GPUK8S_HOST_PYTHONS is not set: run scripts/host-pythons"
    return {version_of(p): p for p in listed}


def test_every_supported_host_python_is_available() -> None:
    """No silent gaps: each of 3.8-3.12 must be tested (scripts/host-pythons)."""
    assert sorted(host_pythons(), key=lambda v: tuple(map(int, v.split(".")))) == list(
        SUPPORTED
    ), f"host Pythons found: {host_pythons()}; install them with pyenv"


def test_modules_four_steps_under_every_host_python(tmp_path: Path) -> None:
    pythons = host_pythons()
    assert pythons, "no host Python found"
    inventory: dict[str, dict[str, str]] = {}
    for version, python in pythons.items():
        name = "py" + version.replace(".", "")
        # one interpreter for every module: the host venvs hold ruamel.yaml too
        inventory[name] = {**host_vars(tmp_path / name, python, python),
                           "ansible_connection": "local"}
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps({"all": {"hosts": inventory}}))
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(hosts), "--forks", str(len(inventory)),
         str(REPO / "tests/ansible/playbooks/modules_on_sim.yml")],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
    for name in inventory:
        assert re.search(rf"^{name}\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0",
                         proc.stdout, re.M), f"{name} did not pass:\n{proc.stdout[-4000:]}"
        manifest = tmp_path / name / "cp/etc/kubernetes/manifests/kube-scheduler.yaml"
        assert manifest.read_bytes() == SAMPLE_MANIFEST.read_bytes()


@pytest.mark.parametrize("minor", TOO_OLD)
@pytest.mark.parametrize("module", ["gpu_facts", "gpu_labels"])
def test_older_python_fails_with_a_clear_message(minor: str, module: str, tmp_path: Path) -> None:
    python = pyenv_python(minor)
    assert python, f"pyenv has no Python {minor} (this machine kind ships 2.7 and 3.6-3.13)"
    root = tmp_path / "sim"
    sim.create(str(root), "c500-8")
    args = f"host_root={root}" + (" topology=false" if module == "gpu_facts" else "")
    proc = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={python}", "-m", module, "-a", args],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode != 0
    result = json.loads(proc.stdout.split("| FAILED! =>", 1)[1])
    assert f"gpuk8s module {module} needs Python >= 3.8 on the managed host" in result["msg"]
    assert f"{python} is Python {minor}." in result["msg"]
    assert "ansible_python_interpreter" in result["msg"]
    assert "SyntaxError" not in result["msg"] and "Traceback" not in result["msg"]


def test_every_module_has_the_host_python_action_plugin() -> None:
    modules = sorted(p.stem for p in (REPO / "library").glob("*.py"))
    plugins = REPO / "action_plugins"
    for name in modules:
        text = (plugins / f"{name}.py").read_text()
        assert 'action_loader.get("gpuk8s_host_python", class_only=True)' in text, name
    assert "action_plugins = action_plugins" in (REPO / "ansible.cfg").read_text()
