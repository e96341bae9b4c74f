"""install.yml / uninstall.yml on an inventory with scheme groups (playbooks/vars/schemes.yml)
and what the chart role derives from the node group (roles/gpu_chart/vars/main.yml):
both schemes at once, each confined to its group by the gpuk8s.io/scheme label. Run by
the real ansible-playbook on localhost (connection local, nothing changed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def derive(tmp_path: Path, groups: dict[str, Any], extra: dict[str, Any] | None = None,
           role: str = "gpu_extensions", node_group: str = "") -> dict[str, Any]:
    """The scheme variables (and the chart role's, for ``role`` confined to ``node_group``)
    as ansible-playbook computes them for an inventory of ``groups``."""
    inventory = {"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
                         "children": groups}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    out = tmp_path / "out.json"
    chart = "metax-operator" if role == "gpu_operator" else "metax-gpu-extensions"
    play = [{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(REPO / "playbooks/vars/schemes.yml"),
                       str(REPO / f"roles/{role}/defaults/main.yml"),
                       str(REPO / "roles/gpu_chart/vars/main.yml")],
        "vars": {"gpu_chart_name": chart, "gpu_chart_prefix": role,
                 "gpu_chart_scheme_values": {}},
        "tasks": [{"ansible.builtin.copy": {"dest": str(out), "mode": "0600", "content": (
            "{{ {'schemes': gpuk8s_schemes, 'by_group': gpuk8s_schemes_by_group,"
            " 'aware': gpuk8s_gpu_aware_scheme, 'nodes': gpu_chart_group_nodes,"
            " 'values': gpu_chart_values, 'selector': gpu_chart_gpu_node_selector,"
            " 'min': gpu_chart_min_gpu_nodes | int} | to_json }}")}}],
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
         "-e", json.dumps({f"{role}_node_group": node_group, **(extra or {})})],
        capture_output=True, text=True, check=False, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found: dict[str, Any] = json.loads(out.read_text())
    return found


FLEET = {  # inventories/fleet's shape
    "gpu_nodes": {"children": {
        "gpu_extensions_nodes": {"hosts": {"gpu-ext": {}, "gpu-vf": {}}},
        "gpu_operator_nodes": {"hosts": {"gpu-op": {"gpuk8s_node_name": "op-node"}}}}},
}


def test_both_groups_install_both_schemes_each_confined_to_its_group(tmp_path: Path) -> None:
    ext = derive(tmp_path, FLEET, node_group="gpu_extensions_nodes")
    assert ext["schemes"] == ext["by_group"] == ["extensions", "operator"]
    assert ext["aware"] == "extensions"  # one scheduler extender: the first scheme's
    assert ext["nodes"] == ["gpu-ext", "gpu-vf"] and ext["min"] == 2
    assert ext["values"]["nodeSelector"] == {"gpuk8s.io/scheme": "extensions"}
    assert ext["selector"] == "metax-tech.com/gpu.installed=true,gpuk8s.io/scheme=extensions"
    op = derive(tmp_path, FLEET, role="gpu_operator", node_group="gpu_operator_nodes")
    assert op["nodes"] == ["op-node"] and op["min"] == 1  # the host's Kubernetes name
    assert op["values"]["nodeSelector"] == {"gpuk8s.io/scheme": "operator"}


def test_an_explicit_scheme_or_no_scheme_group_is_one_scheme_on_every_node(
    tmp_path: Path,
) -> None:
    one = derive(tmp_path, FLEET, {"gpuk8s_scheme": "operator"})
    assert one["schemes"] == ["operator"] and one["by_group"] == []
    assert "nodeSelector" not in one["values"] and one["nodes"] == []
    assert one["selector"] == "metax-tech.com/gpu.installed=true"
    plain = derive(tmp_path, {"gpu_nodes": {"hosts": {"a": {}, "b": {}, "c": {}}}})
    assert plain["schemes"] == ["extensions"] and plain["by_group"] == []
    assert plain["min"] == 3  # the gpu_nodes group, as before
    only_op = derive(tmp_path, {"gpu_operator_nodes": {"hosts": {"x": {}}},
                                "gpu_extensions_nodes": {"hosts": {}}})
    assert only_op["schemes"] == ["operator"] and only_op["aware"] == "operator"
