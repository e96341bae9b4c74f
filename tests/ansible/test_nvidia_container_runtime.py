"""nvidia_container_runtime through real Ansible: ``--check --diff`` shows containerd's
config before and after, and the run that follows writes exactly that ``after``; the same
for ``state=absent`` (the file back byte for byte, or removed where the module created it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from tests.ansible.test_ansible_layer import BIN, REPO, env
from tests.containerd_corpus import cases

pytestmark = pytest.mark.slow


def module(args: dict[str, Any], check: bool) -> dict[str, Any]:
    """One ad-hoc run of the module (``--diff``; ``--check``); its result."""
    proc = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-m", "nvidia_container_runtime",
         "-a", json.dumps(args), "--diff", *(["--check"] if check else [])],
        cwd=REPO, env={**env(), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
                       "ANSIBLE_STDOUT_CALLBACK": "json"},
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"][
        "localhost"]
    return result


@pytest.mark.parametrize("shape", ["dotted-runtimes", None], ids=["dotted-keys", "no-config"])
def test_check_and_diff_predict_exactly_what_the_run_writes(tmp_path: Path,
                                                           shape: str | None) -> None:
    node, system = tmp_path / "node", tmp_path / "sys"
    sim.create(str(node), "nvidia-8")
    config = system / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    (system / "usr/bin").mkdir(parents=True)
    (system / "usr/bin/python3").symlink_to(sys.executable)  # runs the wrapper on the node
    original = next(c.text for c in cases() if c.name == shape) if shape else None
    if original is not None:
        config.write_text(original)
    args = {"host_root": str(node), "system_root": str(system), "device_path_prefix": str(node),
            "containerd_version": "1.6.20", "restart_mode": "none",
            "containerd_socket": str(system / "run/c.sock")}
    checked = module(args, check=True)
    assert checked["changed"]
    diff = checked["diff"]
    assert diff["before"] == (original or "")
    assert diff["before_header"] == ("/etc/containerd/config.toml" if original else "(no file)")
    assert (config.read_text() if original else None) == original and \
        os.path.exists(config) == bool(original)  # check mode changed nothing
    done = module(args, check=False)
    assert done["changed"] and done["actions"] == checked["actions"]
    assert config.read_text() == diff["after"]  # exactly what check mode showed
    again = module(args, check=True)
    assert not again["changed"] and "diff" not in again
    absent = {**args, "state": "absent"}
    checked = module(absent, check=True)
    assert checked["diff"]["before"] == diff["after"]
    assert checked["diff"]["after"] == (original or "")
    assert checked["diff"]["after_header"] == (
        "/etc/containerd/config.toml" if original else "(removed)")
    module(absent, check=False)
    if original is None:
        assert not config.exists()
    else:
        assert config.read_text() == original  # byte for byte
