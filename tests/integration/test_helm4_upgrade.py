"""helm 4 (the lab's helm) on a private API server: an upgrade after a live edit of the
weights, and a release that an uninstall left behind (issue 52).

helm 4 applies server-side: a key another field manager owns (``kubectl replace`` /
``kubectl edit`` of ConfigMap gpu-aware-plugin) stops an upgrade that changes it, the
release is left ``failed``, until the upgrade is run with ``--force-conflicts`` (the
command NOTES.txt and docs/extender.md give). The real kubectl makes the edit. A release
left ``uninstalling`` is listed by the manual's ``helm list -q -f "metax"`` on helm 4 (on
helm 3 only with ``-a``) and found by roles/gpu_chart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_package_install import _helm3, _helm_as

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

NS = "metax-gpu-extensions"
# gpu-aware's NetworkPolicy fails closed: this API server has no control-plane Node to look
# up, so kube-scheduler's host is named (a documentation address)
ON = ("--set", "deployExtenderGPUAware=true",
      "--set", "gpuAware.networkPolicy.controlPlaneCIDRs={192.0.2.10/32}")


def _status(helm: Any, rel: str, ns: str) -> str:
    return str(json.loads(helm("status", rel, "-n", ns, "-o", "json").stdout)["info"]["status"])


def _kubectl(apiserver: Any) -> Any:
    binary = apiserver.binary("kubectl")
    if not binary:
        pytest.skip("kubectl not built (lab/tools.sh kube)")

    def run(*args: str, stdin: str | None = None) -> str:
        proc = subprocess.run([binary, "--kubeconfig", apiserver.kubeconfig("admin"), *args],
                              input=stdin, capture_output=True, text=True, check=False,
                              timeout=60)
        assert proc.returncode == 0, f"kubectl {args}: {proc.stderr}"
        return proc.stdout

    return run


def test_upgrade_with_a_new_weight_after_kubectl_replace(
    apiserver: Any, helm: Any, charts: dict[str, str]
) -> None:
    rel, chart = "metax-w4", charts["metax-gpu-extensions"]
    kubectl = _kubectl(apiserver)
    helm("install", rel, chart, "-n", NS, "--create-namespace", *ON)
    try:
        # the administrator's live edit: kubectl replace (field manager "kubectl-replace")
        live = json.loads(kubectl("get", "configmap", "gpu-aware-plugin", "-n", NS,
                                  "-o", "json"))
        live["data"]["scoreWeight"] = "3"
        kubectl("replace", "-f", "-", stdin=json.dumps(live))
        managers = json.loads(kubectl("get", "configmap", "gpu-aware-plugin", "-n", NS,
                                      "--show-managed-fields", "-o", "json"))
        assert "kubectl-replace" in [m["manager"] for m in
                                     managers["metadata"]["managedFields"]]

        def weights() -> dict[str, str]:
            cm = json.loads(kubectl("get", "configmap", "gpu-aware-plugin", "-n", NS,
                                    "-o", "json"))
            return dict(cm["data"])

        five = ("upgrade", rel, chart, "-n", NS, *ON, "--set", "gpuAware.scoreWeight=5")
        # without --force-conflicts helm 4 stops on the key kubectl-replace owns, changes
        # nothing, and the release is left failed
        refused = helm(*five, check=False)
        assert refused.returncode != 0
        assert 'conflict with "kubectl-replace"' in refused.stderr
        assert ".data.scoreWeight" in refused.stderr
        assert weights() == {"scoreWeight": "3", "lossWeight": "1"}
        assert _status(helm, rel, NS) == "failed"
        # the command NOTES.txt gives: the chart's new value replaces the edit, deployed
        out = helm(*five, "--force-conflicts").stdout
        assert weights() == {"scoreWeight": "5", "lossWeight": "1"}
        assert _status(helm, rel, NS) == "deployed"
        assert "gpuAware.scoreWeight: the chart's new value 5 replaced the live edit 3" in out
        # helm now owns the key again: the next upgrade needs no --force-conflicts
        helm("upgrade", rel, chart, "-n", NS, *ON, "--set", "gpuAware.scoreWeight=6")
        assert weights() == {"scoreWeight": "6", "lossWeight": "1"}
        assert _status(helm, rel, NS) == "deployed"
    finally:
        # --no-hooks: the pre-delete node-cleanup hook is a Job, and this tier runs no pods
        helm("uninstall", rel, "-n", NS, "--no-hooks", "--wait", "--timeout", "120s")


def test_live_edit_that_stays_names_the_command_that_replaces_it(
    apiserver: Any, helm: Any, charts: dict[str, str]
) -> None:
    """NOTES.txt of an upgrade that keeps a live edit gives the exact command that
    replaces it, --force-conflicts included."""
    rel, chart, ns = "metax-w4n", charts["metax-gpu-extensions"], "metax-gpu-notes"
    kubectl = _kubectl(apiserver)
    helm("install", rel, chart, "-n", ns, "--create-namespace", *ON)
    try:
        kubectl("patch", "configmap", "gpu-aware-plugin", "-n", ns, "--type", "merge",
                "-p", '{"data": {"lossWeight": "4"}}')
        out = helm("upgrade", rel, chart, "-n", ns, *ON).stdout
        assert ("gpuAware.lossWeight: the live edit 4 stays (the chart's 1 is unchanged; "
                f"helm upgrade {rel} <CHART> -n {ns} --reuse-values "
                "--set gpuAware.lossWeight=<a new value> --force-conflicts replaces it)") in out
    finally:
        # --no-hooks: the pre-delete node-cleanup hook is a Job, and this tier runs no pods
        helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s")


def test_a_release_whose_uninstall_hung_is_still_listed(
    apiserver: Any, helm: Any, charts: dict[str, str]
) -> None:
    """The operator's pre-delete hook (a Job) never finishes on an API server without a
    kubelet: the uninstall times out and the release is left ``uninstalling``. The
    manual's script (``helm list -q -f "metax" -n metax-operator``) must still find it."""
    rel, chart, ns = "metax-op4", charts["metax-operator"], "metax-operator-hung"
    helm("install", rel, chart, "-n", ns, "--create-namespace", "--set",
         "driver.deployPolicy=Never")
    try:
        hung = helm("uninstall", rel, "-n", ns, "--wait", "--timeout", "5s", check=False)
        assert hung.returncode != 0
        assert _status(helm, rel, ns) == "uninstalling"
        assert helm("list", "-q", "-f", "metax", "-n", ns).stdout.split() == [rel]
        listed = json.loads(helm("list", "--uninstalling", "-n", ns, "-o", "json").stdout)
        assert [(r["name"], r["status"]) for r in listed] == [(rel, "uninstalling")]
        # helm 3 (the playbooks' kubernetes.core.helm) lists deployed and failed releases
        # only: there the manual's script needs -a (docs/charts.md)
        helm3 = _helm_as(apiserver, _helm3())
        assert helm3("list", "-q", "-f", "metax", "-n", ns).stdout.split() == []
        assert helm3("list", "-a", "-q", "-f", "metax", "-n", ns).stdout.split() == [rel]
    finally:
        helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s",
             check=False)
    assert helm("list", "-q", "-n", ns).stdout.split() == []


def _operator_role(apiserver: Any, tmp: Path, state: str) -> subprocess.CompletedProcess[str]:
    """roles/gpu_operator with ``state`` on the API server, with helm 3 (what
    kubernetes.core.helm needs), no verification, a 5 s timeout."""
    play = tmp / f"{state}.yml"
    play.write_text(json.dumps([{
        "name": "operator", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "the role", "ansible.builtin.include_role": {"name": "gpu_operator"},
                   "vars": {"gpu_operator_state": state, "gpu_operator_verify": False,
                            "gpu_operator_namespace": "metax-operator-role",
                            "gpu_operator_driver_deploy_policy": "Never",
                            "gpu_operator_wait_timeout": "5s",
                            "gpu_operator_kubeconfig": apiserver.kubeconfig("admin"),
                            "gpu_operator_helm_binary": _helm3()}}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
         f"ansible_python_interpreter={sys.executable}", str(play)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_the_role_finds_a_release_left_uninstalling(
    apiserver: Any, helm: Any, charts: dict[str, str], tmp_path: Path
) -> None:
    """roles/gpu_chart lists releases left ``uninstalling``: an install beside one is
    refused before anything changes, an uninstall runs it again and, when its hook still
    does not finish, fails naming ``--no-hooks``."""
    rel, chart, ns = "metax-op4r", charts["metax-operator"], "metax-operator-role"
    helm("install", rel, chart, "-n", ns, "--create-namespace", "--set",
         "driver.deployPolicy=Never")
    try:
        helm("uninstall", rel, "-n", ns, "--wait", "--timeout", "5s", check=False)
        assert _status(helm, rel, ns) == "uninstalling"
        present = _operator_role(apiserver, tmp_path, "present")
        assert present.returncode != 0
        out = " ".join(present.stdout.split())
        assert (f"release {rel} in namespace {ns} is left 'uninstalling'" in out), out[-3000:]
        assert "Install the chart" not in present.stdout
        assert helm("list", "-q", "-n", ns).stdout.split() == [rel]  # nothing new
        absent = _operator_role(apiserver, tmp_path, "absent")
        assert absent.returncode != 0
        out = " ".join(absent.stdout.split())
        assert f"release {rel} in namespace {ns} is still 'uninstalling'" in out, out[-3000:]
        assert f"helm uninstall {rel} -n {ns} --no-hooks" in out
        assert _status(helm, rel, ns) == "uninstalling"
    finally:
        helm("uninstall", rel, "-n", ns, "--no-hooks", "--wait", "--timeout", "120s",
             check=False)
    assert helm("list", "-q", "-n", ns).stdout.split() == []
