"""roles/gpu_chart's uninstall removes the release the administrator named
(``<role>_release_name``), not every release of the chart in its namespace (issue 49:
never leave a cluster worse than found); with no name, every release of the chart. And
an install under a name that is not the chart's release in the namespace is refused before
anything changes, unless ``<role>_allow_second_release`` asks for a second release.

Real ansible-playbook runs the real roles on localhost; helm is a stand-in that answers
``helm list`` (the role's own and kubernetes.core.helm's) from a fixed list and records
every ``uninstall`` and ``upgrade`` it is asked for. Where a named release is removed
beside another release of the chart, the role reads nothing from the cluster (the other
release's pods and the scheme label stay), so no API server is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible.test_ansible_layer import BIN, REPO, env

pytestmark = pytest.mark.slow

NS = "metax-gpu-extensions"
# helm list --output json of a namespace with two releases of the chart (one left
# 'uninstalling') and one release of another chart
LISTED = [
    {"name": "metax-a", "namespace": NS, "status": "deployed",
     "chart": "metax-gpu-extensions-1.2.3", "app_version": "1.2.3"},
    {"name": "metax-b", "namespace": NS, "status": "failed",
     "chart": "metax-gpu-extensions-1.2.4", "app_version": "1.2.4"},
    {"name": "metax-c", "namespace": NS, "status": "uninstalling",
     "chart": "metax-gpu-extensions-1.2.3", "app_version": "1.2.3"},
    {"name": "web", "namespace": NS, "status": "deployed", "chart": "nginx-15.0.0",
     "app_version": "1.27"},
]

FAKE_HELM = """#!{python}
import json, sys
args = sys.argv[1:]
if args[:1] == ["version"]:
    print('version.BuildInfo{{Version:"v3.19.0", GitCommit:"", GoVersion:"go1.25"}}')
elif args[:1] == ["list"]:
    listed = json.load(open({listed!r}))
    if "--filter" in args:  # kubernetes.core.helm: YAML (JSON is YAML), --all
        wanted = args[args.index("--filter") + 1]
        listed = [r for r in listed if wanted in r["name"]]
    print(json.dumps(listed))
elif args[:2] == ["get", "values"]:  # kubernetes.core.helm reads the release's values
    print("{{}}")
elif args[:2] == ["plugin", "list"]:  # no helm-diff: kubernetes.core.helm compares itself
    print("NAME\\tVERSION\\tDESCRIPTION")
elif args[:2] == ["show", "chart"]:  # kubernetes.core.helm reads the chart's name, version
    print("apiVersion: v2\\nname: metax-gpu-extensions\\nversion: 1.2.3")
elif args[:1] in (["uninstall"], ["upgrade"]):
    with open({calls!r}, "a") as out:
        out.write(json.dumps(args) + "\\n")
else:
    sys.exit("fake helm: unexpected " + " ".join(args))
"""


def role(tmp_path: Path, role_vars: dict[str, Any], check: bool,
         listed: list[dict[str, str]] = LISTED
         ) -> tuple[list[list[str]], subprocess.CompletedProcess[str]]:
    """roles/gpu_extensions with ``role_vars`` on a namespace whose ``helm list`` is
    ``listed``: the helm uninstalls and installs it ran (each with the release names in its
    arguments), and ansible-playbook's run."""
    listed_file, calls = tmp_path / "listed.json", tmp_path / "calls.jsonl"
    listed_file.write_text(json.dumps(listed))
    calls.unlink(missing_ok=True)
    helm = tmp_path / "helm"
    helm.write_text(FAKE_HELM.format(python=sys.executable, listed=str(listed_file),
                                     calls=str(calls)))
    helm.chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}\n")
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{
        "name": "the role", "ansible.builtin.include_role": {"name": "gpu_extensions"},
        "vars": {"gpu_extensions_namespace": NS, "gpu_extensions_helm_binary": str(helm),
                 "gpu_extensions_kubeconfig": str(kubeconfig),
                 "gpu_extensions_wait_timeout": "5s", **role_vars}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}",
         *(["--check"] if check else []), str(tmp_path / "play.yml")],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=600, check=False)
    names = {release["name"] for release in listed} | {role_vars.get(
        "gpu_extensions_release_name", "")}
    done = [[json.loads(line)[0], *(a for a in json.loads(line) if a in names)]
            for line in (calls.read_text().splitlines() if calls.exists() else [])]
    return done, proc


def uninstall(tmp_path: Path, name: str, check: bool) -> tuple[list[list[str]], str]:
    """roles/gpu_extensions with state absent (and ``name`` as its release name): the helm
    uninstalls it ran, and ansible-playbook's output."""
    done, proc = role(tmp_path, {"gpu_extensions_state": "absent",
                                 "gpu_extensions_release_name": name}, check)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return done, proc.stdout


@pytest.mark.parametrize("name", ["metax-a", "metax-b", "metax-c"])
def test_a_named_release_is_the_only_one_removed(tmp_path: Path, name: str) -> None:
    done, out = uninstall(tmp_path, name, check=False)
    assert done == [["uninstall", name]]
    # the other release of the chart stays, and so do its pods and the nodes' scheme label:
    # the uninstall is the one change (no cluster to read here: a read would have failed)
    assert "changed=1" in out and "failed=0" in out


@pytest.mark.parametrize("name", ["metax-a", "metax-c"])
def test_check_mode_predicts_the_one_release_and_removes_nothing(tmp_path: Path,
                                                                 name: str) -> None:
    done, out = uninstall(tmp_path, name, check=True)
    assert done == []
    assert "changed=1" in out  # the one uninstall the real run makes


@pytest.mark.parametrize("name", ["web", "metax-z"])
def test_a_name_that_is_not_a_release_of_the_chart_removes_nothing(tmp_path: Path,
                                                                   name: str) -> None:
    done, out = uninstall(tmp_path, name, check=False)
    assert done == []
    assert "changed=0" in out and "failed=0" in out


def chart_vars(tmp_path: Path, name: str) -> dict[str, Any]:
    """roles/gpu_chart/vars/main.yml's selection, as ansible-playbook computes it from the
    same ``helm list``, with or without a release name."""
    out = tmp_path / "out.json"
    play = [{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(REPO / "roles/gpu_extensions/defaults/main.yml"),
                       str(REPO / "roles/gpu_chart/vars/main.yml")],
        "vars": {"gpu_chart_name": "metax-gpu-extensions", "gpu_chart_prefix": "gpu_extensions",
                 "gpu_chart_scheme_values": {},
                 "gpu_chart_helm_list": {"stdout": json.dumps(LISTED)}},
        "tasks": [{"ansible.builtin.copy": {"dest": str(out), "mode": "0600", "content": (
            "{{ {'remove': gpu_chart_uninstall_names, 'finish': gpu_chart_uninstall_stuck,"
            " 'kept': gpu_chart_releases_kept, 'install': gpu_chart_release_names,"
            " 'refuse': gpu_chart_uninstalling} | to_json }}")}}],
    }]
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(play))
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}",
         # (over vars_files' default)
         "-e", json.dumps({"gpu_extensions_release_name": name}), str(tmp_path / "vars.yml")],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found: dict[str, Any] = json.loads(out.read_text())
    return found


def test_without_a_name_every_release_of_the_chart_is_removed(tmp_path: Path) -> None:
    assert chart_vars(tmp_path, "") == {
        "remove": ["metax-a", "metax-b"], "finish": ["metax-c"], "kept": [],
        "install": ["metax-a", "metax-b"], "refuse": ["metax-c"]}
    # a name narrows the uninstall only: install's reuse and refusal see every release
    assert chart_vars(tmp_path, "metax-b") == {
        "remove": ["metax-b"], "finish": [], "kept": ["metax-a", "metax-c"],
        "install": ["metax-a", "metax-b"], "refuse": ["metax-c"]}


# the namespace without the release left 'uninstalling' (an install beside that one is
# refused for that reason first)
SETTLED = [r for r in LISTED if r["status"] != "uninstalling"]


@pytest.mark.parametrize("check", [False, True])
def test_a_second_release_of_the_chart_is_refused_naming_both(tmp_path: Path,
                                                              check: bool) -> None:
    """A release name that is not the chart's release in the namespace would install a
    second copy of the chart beside it: refused before anything is changed, naming both
    releases and the variables that decide."""
    done, proc = role(tmp_path, {"gpu_extensions_release_name": "metax-z",
                                 "gpu_extensions_verify": False}, check, SETTLED)
    assert proc.returncode != 0 and done == []
    out = " ".join(proc.stdout.split())
    assert "gpu_extensions_release_name is metax-z, but namespace metax-gpu-extensions " \
        "already has release metax-a, metax-b of metax-gpu-extensions" in out, out[-3000:]
    assert "gpu_extensions_allow_second_release=true" in out
    assert "changed=0" in proc.stdout


def test_a_second_release_is_installed_when_asked_for(tmp_path: Path) -> None:
    done, proc = role(tmp_path, {"gpu_extensions_release_name": "metax-z",
                                 "gpu_extensions_allow_second_release": True,
                                 "gpu_extensions_verify": False}, False, SETTLED)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert done == [["upgrade", "metax-z"]]


@pytest.mark.parametrize("name", ["metax-a", ""])
def test_the_release_in_the_namespace_is_upgraded_as_before(tmp_path: Path, name: str) -> None:
    """Its own name, or none: the chart's release found there is the one upgraded."""
    done, proc = role(tmp_path, {"gpu_extensions_release_name": name,
                                 "gpu_extensions_verify": False}, False, SETTLED[:1])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert done == [["upgrade", "metax-a"]]
