#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: SR-IOV virtual functions per GPU (GPU virtualisation, extensions scheme)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_vfnum
short_description: Set the number of SR-IOV virtual functions of a host's GPUs
description:
  - Gives every selected GPU O(vfnum) virtual functions through the kernel's SR-IOV
    interface (C(sriov_numvfs)), or through O(command) (for example the vendor's
    C(mx-smi vm --enable-vf)).
  - Allowed values are 0, 1, 2, 4 and 8, and at most the GPU's C(sriov_totalvfs);
    anything else is an error and nothing is written.
  - A GPU that already has a different non-zero count first gets 0 (the kernel refuses
    to change one non-zero count into another). GPUs that already have O(vfnum) are
    not touched.
  - Capacity of C(metax-tech.com/gpu) becomes GPUs x O(vfnum); drain the node's GPU
    pods first (the gpu_virtualization role does).
version_added: "0.1.0"
author:
  - gpuk8s contributors
options:
  vfnum:
    description: Virtual functions per GPU; 0 turns virtualisation off.
    type: int
    required: true
  gpus:
    description: GPU indices or PCI addresses to change; all GPUs of the host when empty.
    type: list
    elements: str
    default: []
  command:
    description:
      - Run this program instead of writing C(sriov_numvfs) directly, once per write.
        Placeholders C({address}), C({index}) (GPU index), C({vfnum}) (the value of this
        write, 0 first when needed) and C({host_root}) are replaced in each item.
      - The result is read back from C(sriov_numvfs) either way.
    type: list
    elements: str
  host_root:
    description:
      - Directory the host's files are under (C(/) on a real host; a simulator root in tests).
    type: path
    default: /
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Four VFs on every GPU
  gpu_vfnum:
    vfnum: 4

- name: Through the vendor tool on two GPUs
  gpu_vfnum:
    vfnum: 2
    gpus: ["0000:0a:00.0", "0000:0b:00.0"]
    command: [/opt/mxdriver/bin/mx-smi, vm, --enable-vf, "{vfnum}", -i, "{address}"]

- name: Virtualisation off
  gpu_vfnum:
    vfnum: 0
"""

RETURN = r"""
vfnum:
  description: The requested VFs per GPU.
  returned: always
  type: int
  sample: 4
before:
  description: VF count per selected GPU (PCI address) before the run.
  returned: always
  type: dict
  sample: {"0000:0a:00.0": 0}
after:
  description: VF count per selected GPU read back after the run (the planned values in check mode).
  returned: always
  type: dict
  sample: {"0000:0a:00.0": 4}
writes:
  description: Writes done (or that would be done), in order.
  returned: always
  type: list
  elements: dict
  sample: [{"address": "0000:0a:00.0", "value": 0}, {"address": "0000:0a:00.0", "value": 4}]
vf_addresses:
  description: PCI addresses of each selected GPU's VFs after the run (from its virtfn links).
  returned: always
  type: dict
  sample: {"0000:0a:00.0": ["0000:0a:00.1", "0000:0a:00.2"]}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.discovery import discover  # noqa: E402
from ansible.module_utils.gpuk8s.host import vf  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vfnum=dict(type="int", required=True),
            gpus=dict(type="list", elements="str", default=[]),
            command=dict(type="list", elements="str"),
            host_root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    root = params["host_root"]
    try:
        plan = vf.plan(discover(root), params["vfnum"], params["gpus"])
        after = dict(plan.after)
        vf_addresses = {g.pci_address: list(g.sriov.vf_addresses) for g in plan.targets}
        if plan.changed and not module.check_mode:
            done = vf.apply(root, plan, lambda argv: module.run_command(argv), params["command"])
            after, vf_addresses = done.after, done.vf_addresses
            for warning in done.warnings:
                module.warn(warning)
    except GpuK8sError as err:
        module.fail_json(msg=str(err))
    result = dict(
        changed=plan.changed,
        vfnum=params["vfnum"],
        before=plan.before,
        after=after,
        writes=[dict(address=s.address, value=s.value) for s in plan.steps],
        vf_addresses=vf_addresses,
    )
    if module._diff:
        result["diff"] = dict(
            before="".join(f"{a} sriov_numvfs={n}\n" for a, n in sorted(plan.before.items())),
            after="".join(f"{a} sriov_numvfs={n}\n" for a, n in sorted(plan.after.items())),
            before_header="sriov_numvfs", after_header="sriov_numvfs",
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
