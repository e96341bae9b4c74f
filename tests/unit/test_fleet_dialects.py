"""The fleet lab's node dialects (lab/fleet/dialects) as the project's code meets them,
where no daemon is needed: every file renders with the lab's values, and
kube_scheduler_extender (through the AnsibleModule harness) adds gpu-aware's extender to
each dialect's kube-scheduler manifest, then removes it, every file back byte for byte,
and never removes an entry it did not write. (The containerd side: the corpus cases
``fleet-*`` in tests/unit/test_runtime_containerd.py and the integration tests.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuk8s.ansible import schedfiles
from gpuk8s.ansible.harness import run_module
from gpuk8s.core import schedconf
from gpuk8s.core.schedconf import ANNOTATION
from tests.fleet_dialects import PLACEHOLDER, Dialect, dialects

MANIFEST = "/etc/kubernetes/manifests/kube-scheduler.yaml"
URL = "http://10.96.0.50:8080"
GPU = [{"name": "metax-tech.com/gpu"}]


def host(tmp_path: Path, dialect: Dialect) -> Path:
    """A control-plane node root holding the dialect's manifest and scheduler files."""
    root = tmp_path / dialect.name
    for path, text in {MANIFEST: dialect.scheduler, **dialect.scheduler_files}.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
    return root


def kubeconfig(dialect: Dialect) -> str:
    """The scheduler kubeconfig its manifest names (rke2 keeps its own)."""
    flags = [line.split("=", 1)[1] for line in dialect.scheduler.splitlines()
             if line.strip().startswith("- --kubeconfig=")]
    assert len(flags) == 1, flags
    return flags[0]


def run(root: Path, dialect: Dialect, check: bool = False, **args: Any) -> dict[str, Any]:
    params = {"host_root": str(root), "kubeconfig": kubeconfig(dialect), **args}
    if params.get("state", "present") == "present":
        params.setdefault("url_prefix", URL)
        params.setdefault("managed_resources", GPU)
    result = run_module("kube_scheduler_extender", params, check_mode=check, diff=True)
    assert not result.get("failed"), result
    return result


def warnings(root: Path, dialect: Dialect, state: str) -> list[str]:
    """What the module would warn about (the pure planner it runs)."""
    spec = schedconf.ExtenderSpec(URL, managed_resources=(
        schedconf.ManagedResource("metax-tech.com/gpu"),)) if state == "present" else None
    return schedfiles.plan(schedfiles.Request(
        state=state, spec=spec, url_prefix=URL, kubeconfig=kubeconfig(dialect),
        host_root=str(root), managed_resources=("metax-tech.com/gpu",))).warnings


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def extenders(root: Path, path: str) -> list[Any]:
    return list(schedfiles.read(str(root / path.lstrip("/"))).data.get("extenders") or [])


def test_every_dialect_has_its_files_and_only_the_lab_placeholders() -> None:
    names = [d.name for d in dialects()]
    assert names == ["containerd2", "k3s-rke2", "kubeadm", "kubespray"]
    for dialect in dialects():
        assert (dialect.directory / "README.md").read_text().strip()
        used = PLACEHOLDER.findall((dialect.directory / "config.toml").read_text() + (
            dialect.directory / "kube-scheduler.yaml").read_text())
        assert used, dialect.name
        for placeholder in used:  # the README names every placeholder it uses
            assert placeholder in (dialect.directory.parent / "README.md").read_text()
        # filled in by lab/lib.sh's fill_template; render() checks none is left
        assert dialect.config and dialect.scheduler


@pytest.mark.parametrize("dialect", dialects(), ids=lambda d: d.name)
def test_the_extender_goes_in_and_out_leaving_every_file_as_it_was(
    tmp_path: Path, dialect: Dialect,
) -> None:
    root = host(tmp_path, dialect)
    original = snapshot(root)
    planned = run(root, dialect, check=True)
    assert planned["changed"] and snapshot(root) == original  # check mode wrote nothing
    done = run(root, dialect)
    assert done["changed"] and done["manifest_changed"]
    # the dialect's own --config file gets our entry beside its own; else a file of ours
    own = dialect.scheduler_files
    assert done["mode"] == ("appended" if own else "own"), done
    path = next(iter(own)) if own else "/etc/metax/extender.yaml"
    assert done["config_path"] == path
    assert [e["urlPrefix"] for e in extenders(root, path)][-1] == URL
    applied = snapshot(root)
    assert not run(root, dialect, check=True)["changed"]
    assert not run(root, dialect)["changed"] and snapshot(root) == applied
    removed = run(root, dialect, state="absent")
    assert removed["changed"], removed
    assert snapshot(root) == original, removed["changes"]
    assert not run(root, dialect, state="absent")["changed"]  # a second disable: nothing
    assert snapshot(root) == original


@pytest.mark.parametrize("dialect", [d for d in dialects() if d.scheduler_files],
                         ids=lambda d: d.name)
def test_an_administrators_entry_at_our_url_is_never_removed(
    tmp_path: Path, dialect: Dialect,
) -> None:
    """Issue 49 item 6 on the dialects whose scheduler runs a --config of its own: their own
    entry at gpu-aware's URL stays through enable, disable and a second disable."""
    root = host(tmp_path, dialect)
    path = next(iter(dialect.scheduler_files))
    config = root / path.lstrip("/")
    theirs = f"- urlPrefix: {URL}\n  filterVerb: filter\n  weight: 3\n"
    text = config.read_text()
    config.write_text(text.replace("extenders:\n", "extenders:\n" + theirs) if "extenders:"
                      in text else text + "extenders:\n" + theirs)
    original = snapshot(root)
    assert any("was not written by gpuk8s" in w for w in warnings(root, dialect, "present"))
    run(root, dialect)
    assert [e["urlPrefix"] for e in extenders(root, path)].count(URL) == 2
    assert run(root, dialect, state="absent")["changed"]
    assert snapshot(root) == original
    assert any("left in place" in w for w in warnings(root, dialect, "absent"))
    assert not run(root, dialect, state="absent", url_prefix=URL)["changed"]
    assert snapshot(root) == original


def test_the_record_says_when_ours_made_the_extenders_key(tmp_path: Path) -> None:
    """Found on kubespray's shape: its KubeSchedulerConfiguration has no ``extenders`` key
    unless extenders are set, and removing ours left ``extenders: []`` behind. The record
    says when ours made the key, and only then does absent remove it."""
    for dialect in dialects():
        if not dialect.scheduler_files:
            continue
        root = host(tmp_path, dialect)
        run(root, dialect)
        marker = schedfiles.read(str(root / MANIFEST.lstrip("/"))).data["metadata"][
            "annotations"][ANNOTATION]
        made = "extenders" not in next(iter(dialect.scheduler_files.values()))
        assert ('"extendersKey":true' in marker) == made, (dialect.name, marker)
