"""The fleet lab/up starts beside the lab node (lab/fleetctl, lab/README.md "Fleet"): five
nodes with their own roots, addresses, containerd and kubelet, tainted off the single-node
tier, pods reaching each other and the API server across nodes, every host reached by
Ansible over SSH as a user with sudo."""

from __future__ import annotations

import json

import pytest

from .conftest import BUSYBOX, LAB, REPO, STATE, kubectl, kubectl_json, run, tool, wait_until

# The one documented skip besides GPUK8S_E2E: lab/up --no-fleet (GPUK8S_LAB_FLEET=0).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not (STATE / "fleet").is_dir(), reason="no fleet: lab/up --no-fleet"),
]

FLEET = {  # node -> (address, containerd major, role)
    "cp2": ("10.250.0.11", "1", "control-plane"),
    "gpu-ext": ("10.250.0.12", "1", "extensions"),
    "gpu-vf": ("10.250.0.13", "1", "extensions"),
    "gpu-op": ("10.250.0.14", "1", "operator"),
    "gpu-nv": ("10.250.0.15", "2", "nvidia"),
}
FLEET_TOLERATION = {"key": "lab.gpuk8s.io/fleet", "operator": "Exists", "effect": "NoSchedule"}


def fleetctl(*args: str) -> str:
    return run(str(LAB / "fleetctl"), *args).stdout


def test_fleet_nodes_are_ready_with_their_address_runtime_and_taints() -> None:
    nodes = {n["metadata"]["name"]: n for n in kubectl_json("get", "nodes")["items"]}
    for name, (address, containerd, role) in FLEET.items():
        node = nodes[name]
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", (name, ready)
        internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal == [address]
        runtime = node["status"]["nodeInfo"]["containerRuntimeVersion"]
        assert runtime.startswith(f"containerd://{containerd}."), (name, runtime)
        taints = {(t["key"], t["effect"]) for t in node["spec"].get("taints", [])}
        assert ("lab.gpuk8s.io/fleet", "NoSchedule") in taints
        labels = node["metadata"]["labels"]
        assert labels["lab.gpuk8s.io/fleet-role"] == role
        control_plane = ("node-role.kubernetes.io/control-plane", "NoSchedule") in taints
        assert control_plane == (role == "control-plane")
        assert ("node-role.kubernetes.io/control-plane" in labels) == (role == "control-plane")


def test_second_control_plane_runs_a_standby_kube_scheduler() -> None:
    pod = kubectl_json("-n", "kube-system", "get", "pod", "kube-scheduler-cp2")
    assert pod["spec"]["nodeName"] == "cp2"
    assert "--leader-elect=true" in pod["spec"]["containers"][0]["command"]
    wait_until(
        "kube-scheduler-cp2 Ready",
        lambda: all(
            s["ready"]
            for s in kubectl_json("-n", "kube-system", "get", "pod", "kube-scheduler-cp2")[
                "status"
            ]["containerStatuses"]
        ),
        90,
    )
    # one lease for both control planes, as kubeadm's schedulers share it
    holder = kubectl_json("-n", "kube-system", "get", "lease", "kube-scheduler")["spec"]
    assert holder["holderIdentity"]


@pytest.mark.parametrize("node", sorted(FLEET))
def test_each_node_has_its_own_root_and_none_of_the_hosts_credentials(node: str) -> None:
    assert fleetctl("exec", node, "hostname").strip() == node
    kube_etc = set(fleetctl("exec", node, "ls", "/etc/kubernetes").split())
    expected = {"kubelet.conf", "proxy.conf", "pki", "manifests"}
    if node == "cp2":
        expected.add("scheduler.conf")
    assert kube_etc == expected  # no admin.conf, no controller-manager.conf of the host
    assert "ca.key" not in fleetctl("exec", node, "ls", "/etc/kubernetes/pki").split()
    preset = fleetctl("exec", node, "cat", "/var/lib/gpuk8s-lab/sim-preset").strip()
    host_preset = (STATE / "fleet" / node / "state" / "sim-preset").read_text().strip()
    assert preset == host_preset


def _pod(name: str, node: str, command: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "tolerations": [FLEET_TOLERATION],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", command]}],
        },
    }


def test_pods_on_different_nodes_reach_each_other_and_the_api_server(
    namespace: str, lab: dict[str, str]
) -> None:
    ns = namespace
    serve = "mkdir -p /w && echo served-by-$NODE > /w/index.html && exec httpd -f -p 8080 -h /w"
    server = _pod("server", "gpu-nv", serve.replace("$NODE", "gpu-nv"))
    clients = [_pod(f"client-{n}", n, "exec sleep 3600") for n in ("gpu-ext", lab["node"])]
    for obj in (server, *clients):
        kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(obj))
    names = ["server", *(c["metadata"]["name"] for c in clients)]  # type: ignore[index]
    kubectl(
        "-n",
        ns,
        "wait",
        "--for=condition=Ready",
        *(f"pod/{n}" for n in names),
        "--timeout=180s",
        timeout=200,
    )
    server_ip = kubectl("-n", ns, "get", "pod", "server", "-o", "jsonpath={.status.podIP}")
    assert server_ip.startswith("10.244.5.")  # gpu-nv's pod CIDR
    for client in names[1:]:
        got = kubectl(
            "-n",
            ns,
            "exec",
            client,
            "--",
            "sh",
            "-c",
            f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {server_ip} 8080",
        )
        assert got.rstrip().endswith("served-by-gpu-nv"), (client, got)
    # the API server through its Service IP (kube-proxy's rules in the node's netns): a
    # plain-HTTP request to its TLS port is answered by the API server itself
    got = kubectl(
        "-n",
        ns,
        "exec",
        "client-gpu-ext",
        "--",
        "sh",
        "-c",
        "printf 'GET /livez HTTP/1.0\\r\\n\\r\\n' | nc -w 5 10.96.0.1 443",
    )
    assert "Client sent an HTTP request to an HTTPS server" in got


def ansible_fleet(*args: str) -> str:
    """ansible against inventories/fleet, every host at once; its stdout."""
    inventory = str(REPO / "inventories" / "fleet")
    return run(tool("ansible"), "-i", inventory, "all", *args, cwd=str(REPO), timeout=300).stdout


def test_ansible_reaches_every_host_over_ssh_with_sudo_and_discovery() -> None:
    out = ansible_fleet("-m", "setup", "-a", "filter=ansible_user_id", "-b", "-o")
    seen = {}
    for line in out.splitlines():
        host, _, rest = line.partition(" | SUCCESS => ")
        if rest:
            seen[host.strip()] = json.loads(rest)
    assert set(seen) == {"lab", *FLEET}, out
    for host, result in seen.items():
        assert result["ansible_facts"]["ansible_user_id"] == "root", host  # through sudo
        assert result["ansible_facts"]["discovered_interpreter_python"].startswith(
            "/usr/bin/python3"
        )
    plain = ansible_fleet("-m", "command", "-a", "id -un", "-e", "ansible_become=false")
    assert plain.count("gpuk8s-admin") == len(FLEET) + 1, plain
