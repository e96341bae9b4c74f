"""The fleet lab's containerd 2.x node dialect (lab/fleet/dialects/containerd2) under the
NVIDIA runtime module, judged by a private real containerd 2.4.2 (its own root, state and
sockets under a temp dir; the lab's containerd is never touched). The metax handler on every
dialect, with each dialect's own containerd generation, is the corpus test
(``fleet-*`` in tests/integration/test_runtime_containerd.py).

The module (``library/nvidia_container_runtime.py``, through the AnsibleModule harness) runs
the container-runtime agent's code: it asks the containerd serving the node's socket for its
version (no containerd program is under the node root, as on a node whose containerd is not a
distribution package), and that containerd 2.4.2 reads CDI itself, so it writes the CDI spec
only and every containerd file stays as it was; told the node's containerd is a 1.6 it
registers its wrapper, which on this dialect goes in a drop-in of its own: proven by a private
containerd first, served after the restart, and ``state=absent`` gives every file back byte
for byte with the CRI serving.

Needs root and containerd 2.x (scripts/prereqs integration builds it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from gpuk8s import sim
from gpuk8s.ansible.harness import run_module
from gpuk8s.services.runtime import containerd
from tests.fleet_dialects import dialects
from tests.integration.test_runtime_containerd import (  # noqa: F401 (the fixture)
    Node,
    containerd2,
    cri_loaded,
    node,
    node_private,
)

pytestmark = pytest.mark.integration

WRAPPER = "/usr/local/gpuk8s/bin/gpuk8s-oci-runtime"
OURS = "etc/containerd/conf.d/zz-gpuk8s-nvidia.toml"


def fleet_node(make: Callable[[str, str], Node], name: str) -> Node:
    """A private containerd 2.x on the dialect's files (only its root, state, sockets, opt
    directory and stream port moved under the node's temp root)."""
    dialect = next(d for d in dialects() if d.name == name)
    version = int(tomlkit.parse(dialect.config)["version"])
    n = make(containerd2(), node_private(dialect.config, version))
    for path, text in dialect.files.items():
        (n.base / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (n.base / path.lstrip("/")).write_text(text)
    return n


def files(n: Node) -> dict[str, bytes]:
    return {str(p.relative_to(n.base)): p.read_bytes()
            for p in sorted((n.base / "etc/containerd").rglob("*")) if p.is_file()}


OLD = "1.6.20"  # a containerd without CDI of its own: the wrapper registered


def nvidia(n: Node, tmp_path: Path, check: bool = False, **args: Any) -> dict[str, Any]:
    gpus = tmp_path / "gpus"
    if not gpus.exists():
        sim.create(str(gpus), "nvidia-8")
    return run_module("nvidia_container_runtime", {
        "host_root": str(gpus), "system_root": str(n.base), "device_path_prefix": str(gpus),
        "restart_mode": "signal", **args}, check_mode=check, diff=True)


def started(make: Callable[[str, str], Node]) -> tuple[Node, dict[str, bytes], int]:
    """The containerd2 dialect's node serving its CRI: (node, its files, containerd's pid)."""
    n = fleet_node(make, "containerd2")
    original = files(n)
    pid = n.start()
    assert cri_loaded(n) == "ok"
    return n, original, pid


def test_containerd_2_dialect_reads_cdi_itself_so_no_containerd_file_changes(
    node: Callable[[str, str], Node], tmp_path: Path,  # noqa: F811
) -> None:
    n, original, pid = started(node)
    assert containerd.cri_cdi_enabled(n.served())
    done = nvidia(n, tmp_path)  # the version: the serving containerd's, not given
    assert not done.get("failed") and done["mode"] == "native" and done["proof"] is None, done
    assert files(n) == original and n.pid() == pid  # not touched, not restarted
    assert (n.base / "etc/cdi/nvidia.com-gpu.json").exists()
    removed = nvidia(n, tmp_path, state="absent")
    assert not removed.get("failed"), removed
    assert not (n.base / "etc/cdi/nvidia.com-gpu.json").exists()
    assert files(n) == original and n.pid() == pid


def test_containerd_2_dialect_takes_the_nvidia_handler_in_a_drop_in_and_gives_it_back(
    node: Callable[[str, str], Node], tmp_path: Path,  # noqa: F811
) -> None:
    n, original, before = started(node)
    assert containerd.not_served(n.served(), "nvidia", WRAPPER, True)  # not there yet
    # told a 1.6 (no CDI of its own): the wrapper
    checked = nvidia(n, tmp_path, check=True, containerd_version=OLD)
    assert checked["changed"] and files(n) == original  # check mode wrote nothing
    # it names the file the run writes: our drop-in, not the node's config
    assert f"create /{OURS} and restart containerd" in checked["actions"], checked["actions"]
    assert checked["diff"]["after_header"] == f"/{OURS}"
    done = nvidia(n, tmp_path, containerd_version=OLD)
    assert not done.get("failed") and done["mode"] == "wrapper", done
    assert done["proof"] == "proven with a private containerd v2.4.2", done
    assert n.pid() not in (0, before)  # restarted onto it
    assert cri_loaded(n) == "ok"
    served = n.served()
    assert containerd.not_served(served, "nvidia", WRAPPER, True) is None
    assert served["containerd"]["runtimes"]["runc"]["options"].get("BinaryName", "") != WRAPPER
    # the node's own files as they were: the handler is in our drop-in, imported last
    assert {k: v for k, v in files(n).items() if k != OURS} == original
    assert (n.base / OURS).read_text() == checked["diff"]["after"]  # what check mode showed
    assert not nvidia(n, tmp_path, containerd_version=OLD)["changed"]  # a second run: nothing to do
    restarted = n.pid()
    checked = nvidia(n, tmp_path, containerd_version=OLD, check=True, state="absent")
    assert checked["diff"]["before_header"] == f"/{OURS}", checked["diff"]
    assert checked["diff"]["after_header"] == "(removed)"
    removed = nvidia(n, tmp_path, containerd_version=OLD, state="absent")
    assert not removed.get("failed") and removed["changed"], removed
    assert files(n) == original  # byte for byte, our drop-in gone
    assert n.pid() not in (0, restarted)
    assert cri_loaded(n) == "ok"
    assert containerd.not_served(n.served(), "nvidia", None, True) is None
    assert not (n.base / "usr/local/gpuk8s").exists()
