#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: GPU inventory, topology and labels of a host as facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Discover a host's GPUs, driver, SDK and topology
description:
  - Reads the host (sysfs PCI devices, C(/sys/module), the vendor tool C(mx-smi) or
    C(nvidia-smi), C(/opt/maca)) and returns C(ansible_facts.gpuk8s) - the inventory,
    the GPU topology and the node labels of the gpu-label component.
  - Read-only; never reports a change. What could not be read is listed in
    C(ansible_facts.gpuk8s.problems) instead of failing.
version_added: "0.1.0"
author:
  - gpuk8s contributors
options:
  host_root:
    description:
      - Directory the host's files are under (C(/) on a real host; a simulator root in tests).
    type: path
    default: /
  topology:
    description: Also return the pair-level matrix of the GPUs.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Discover GPUs
  gpu_facts:

- name: Show what was found
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpuk8s.gpu_count }} GPU(s), labels {{ ansible_facts.gpuk8s.labels }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts under the key C(gpuk8s).
  returned: always
  type: complex
  contains:
    gpuk8s:
      description: Inventory, labels, topology and problems.
      returned: always
      type: dict
      sample:
        backend: metax
        gpu_count: 8
        inventory:
          backend: metax
          gpus: []
          driver: {loaded: true, version: 2.2.4, mode: native, cuda: null}
        labels: {metax-tech.com/gpu.installed: "true"}
        topology: {matrix: "...", link_groups: {"0": [0, 1, 2, 3]}}
        problems: []
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.core.labels import compute_labels  # noqa: E402
from ansible.module_utils.gpuk8s.core.topology import Topology  # noqa: E402
from ansible.module_utils.gpuk8s.discovery import discover  # noqa: E402


def facts_for(inventory, with_topology):
    """The ``gpuk8s`` fact (pure: built from an inventory)."""
    groups = {}
    for gpu in inventory.gpus:
        if gpu.link_group is not None:
            groups.setdefault(str(gpu.link_group), []).append(gpu.index)
    topology = {"link_groups": groups, "matrix": None}
    if with_topology and inventory.gpus:
        topology["matrix"] = Topology.from_inventory(inventory).matrix_text()
    return {
        "backend": inventory.backend,
        "gpu_count": len(inventory.gpus),
        "inventory": inventory.to_dict(),
        "labels": compute_labels(inventory),
        "topology": topology,
        "problems": list(inventory.problems),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host_root=dict(type="path", default="/"),
            topology=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    try:
        facts = facts_for(discover(module.params["host_root"]), module.params["topology"])
    except GpuK8sError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, ansible_facts={"gpuk8s": facts})


if __name__ == "__main__":
    main()
