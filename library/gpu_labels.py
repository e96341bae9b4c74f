#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: the SPEC §4 node labels of a host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_labels
short_description: Compute the node labels gpu-label writes for a host
description:
  - Discovers the host's GPUs and computes the labels the gpu-label component writes
    (C(gpu.installed), C(driver.ready), C(gpu.driver.*), C(gpu.family), C(gpu.memory),
    C(gpu.product), C(gpu.sriov), C(gpu.vfnum), and optionally C(maca.ready) /
    C(runtime.ready), all under C(metax-tech.com/)).
  - On NVIDIA hosts also the CUDA version the driver supports, prefixed and under the
    accelerator manual's bare keys C(cuda-major-version) / C(cuda-minor-version), and the
    labels of NVIDIA's GPU Feature Discovery (C(nvidia.com/gpu.product), C(.memory),
    C(.count), C(.family), C(.compute.major|minor), C(nvidia.com/cuda.driver.*),
    C(nvidia.com/cuda.runtime.*), C(nvidia.com/mig.*), C(gpu.sharing-strategy),
    C(gpu.replicas), C(mps.capable), C(gpu.machine), C(gpu.mode), C(gpu.present)); the
    sharing labels follow the node's C(gpuk8s.io/sharing-mode) in O(current_labels), as
    gpu-label's do with the chart's C(gpuDevice.sharing).
  - Talks to no API server. Given the node's O(current_labels) it also returns the
    patch (a label mapped to null is to be removed) for C(kubernetes.core.k8s) to apply.
  - Read-only on the host; C(changed) is always false, C(needs_update) tells whether
    the node's labels differ.
version_added: "0.1.0"
author:
  - gpuk8s contributors
options:
  host_root:
    description: Directory the host's files are under (C(/) on a real host).
    type: path
    default: /
  driver_mode:
    description:
      - C(native) when the administrator maintains the driver, C(cloud) when the
        operator's driver-manager does. Default - what discovery reports (native).
    type: str
    choices: [native, cloud]
  readiness:
    description: Operator-scheme readiness, keys C(maca.ready) and C(runtime.ready).
    type: dict
    default: {}
  current_labels:
    description:
      - The node's labels now (all of them; only those gpu-label manages are compared -
        C(metax-tech.com/), the GFD keys, and the bare CUDA keys on NVIDIA hosts).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Labels this host should carry
  gpu_labels:
    current_labels: "{{ node.resources[0].metadata.labels }}"
  register: gpu_labels_result

- name: Apply them
  kubernetes.core.k8s:
    kind: Node
    name: "{{ inventory_hostname }}"
    state: patched
    definition:
      metadata:
        labels: "{{ gpu_labels_result.patch }}"
  delegate_to: localhost
  when: gpu_labels_result.needs_update
"""

RETURN = r"""
labels:
  description: Every label gpu-label would write on the node.
  returned: always
  type: dict
  sample: {"metax-tech.com/gpu.installed": "true", "metax-tech.com/gpu.product": "C500"}
patch:
  description: Labels to set (value) or remove (null) to turn O(current_labels) into RV(labels).
  returned: always
  type: dict
  sample: {"metax-tech.com/gpu.vfnum": "4", "metax-tech.com/old.label": null}
needs_update:
  description: Whether RV(patch) is non-empty.
  returned: always
  type: bool
  sample: true
"""

from dataclasses import replace  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import ConfigError, GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.core.labels import (  # noqa: E402
    MACHINE_UNKNOWN,
    READINESS_KEYS,
    compute_labels,
    gfd_machine,
    is_managed,
    label_diff,
    owned_labels,
    sharing_mode_of,
)
from ansible.module_utils.gpuk8s.core.model import DriverMode  # noqa: E402
from ansible.module_utils.gpuk8s.discovery import discover  # noqa: E402
from ansible.module_utils.gpuk8s.discovery.nvidia import machine_type  # noqa: E402


def labels_for(inventory, driver_mode, readiness, current, machine=MACHINE_UNKNOWN):
    """(labels, patch) for an inventory (pure; ``machine``: GFD's gpu.machine)."""
    for key in readiness:
        if key not in READINESS_KEYS:
            raise ConfigError(
                f"readiness key {key!r}: allowed keys are {', '.join(READINESS_KEYS)}"
            )
    if driver_mode:
        driver = replace(inventory.driver, mode=DriverMode(driver_mode))
        inventory = replace(inventory, driver=driver)
    labels = compute_labels(inventory, readiness={k: bool(v) for k, v in readiness.items()},
                            sharing_mode=sharing_mode_of(current), machine=machine)
    patch = label_diff({str(k): str(v) for k, v in current.items()}, labels,
                       owned=owned_labels(inventory))
    return labels, patch, owned_labels(inventory)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host_root=dict(type="path", default="/"),
            driver_mode=dict(type="str", choices=["native", "cloud"]),
            readiness=dict(type="dict", default={}),
            current_labels=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        labels, patch, owned = labels_for(
            discover(params["host_root"]), params["driver_mode"], params["readiness"],
            params["current_labels"], gfd_machine(machine_type(params["host_root"])),
        )
    except GpuK8sError as err:
        module.fail_json(msg=str(err))
    result = dict(changed=False, labels=labels, patch=patch, needs_update=bool(patch))
    if module._diff:
        before = {k: v for k, v in params["current_labels"].items()
                  if is_managed(k, owned)}
        result["diff"] = dict(
            before="".join(f"{k}={v}\n" for k, v in sorted(before.items())),
            after="".join(f"{k}={v}\n" for k, v in labels.items()),
            before_header="node labels", after_header="computed labels",
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
