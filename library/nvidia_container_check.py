#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: nvidia-smi in a container, through gpuk8s' runtime wrapper and runc."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_container_check
short_description: Run nvidia-smi in a container that gets its GPUs through the node's CDI spec
description:
  - Starts one container the way the kubelet's would be started on the node - an OCI bundle
    whose C(cdi.k8s.io/gpuk8s) annotation names CDI devices, created through gpuk8s' OCI runtime
    wrapper (which applies the node's CDI spec - device nodes, driver libraries and programs,
    the ld.so cache hooks) and run by runc - and runs C(nvidia-smi) and C(nvidia-smi -L) in it
    (C(gpuk8s.host.containercheck)).
  - Fails unless C(nvidia-smi) answers in the container with O(expect_driver) (when given) and
    lists O(expect_gpus) GPUs (when given).
  - The container's root filesystem is a fresh copy of O(rootfs) (the CDI hooks edit it); it and
    the container are removed afterwards. Nothing on the node changes - C(changed) is false.
version_added: "0.2.0"
author:
  - gpuk8s contributors
options:
  rootfs:
    description:
      - An image's root filesystem with C(sh) - a directory, or a tar such as
        C(docker export $(docker create nvidia/cuda:12.4.1-base-ubuntu22.04)) writes.
    type: path
    required: true
  devices:
    description: The CDI devices the container gets (C(nvidia.com/gpu=all) - every GPU).
    type: list
    elements: str
    default: [nvidia.com/gpu=all]
  wrapper:
    description: gpuk8s' OCI runtime wrapper on the node.
    type: path
    default: /usr/local/gpuk8s/bin/gpuk8s-oci-runtime
  runc:
    description: runc; default - the first of C(/usr/sbin/runc), C(/usr/bin/runc), ...
    type: path
  work_dir:
    description: Where the bundle is made (removed afterwards).
    type: path
    default: /var/lib/gpuk8s/nvidia-check
  extra_mounts:
    description:
      - More host paths bound read-only into the container, C(SOURCE:DESTINATION) (tests - the
        simulator's state).
    type: list
    elements: str
    default: []
  expect_driver:
    description: The driver version nvidia-smi must report in the container.
    type: str
  expect_gpus:
    description: How many GPUs nvidia-smi -L must list in the container.
    type: int
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: nvidia-smi in a container sees all eight GPUs and driver 550.54.15
  nvidia_container_check:
    rootfs: /var/tmp/cuda-base-rootfs.tar
    expect_driver: 550.54.15
    expect_gpus: 8
"""

RETURN = r"""
output:
  description: What the container printed.
  returned: always
  type: str
  sample: "| NVIDIA-SMI 550.54.15  Driver Version: 550.54.15  CUDA Version: 12.4 |"
driver_version:
  description: The driver version nvidia-smi reported in the container.
  returned: always
  type: str
  sample: 550.54.15
cuda_version:
  description: The CUDA version nvidia-smi reported in the container.
  returned: always
  type: str
  sample: "12.4"
gpus:
  description: GPUs nvidia-smi -L listed in the container.
  returned: always
  type: int
  sample: 8
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.host import containercheck  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            rootfs=dict(type="path", required=True),
            devices=dict(type="list", elements="str", default=["nvidia.com/gpu=all"]),
            wrapper=dict(type="path", default="/usr/local/gpuk8s/bin/gpuk8s-oci-runtime"),
            runc=dict(type="path"),
            work_dir=dict(type="path", default="/var/lib/gpuk8s/nvidia-check"),
            extra_mounts=dict(type="list", elements="str", default=[]),
            expect_driver=dict(type="str"),
            expect_gpus=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    mounts = []
    for item in p["extra_mounts"]:
        source, sep, destination = item.partition(":")
        if not sep or not source.startswith("/") or not destination.startswith("/"):
            module.fail_json(msg=f"extra_mounts: {item!r} is not SOURCE:DESTINATION (absolute)")
        mounts.append((source, destination))

    def runner(argv):
        return module.run_command(argv)

    try:
        result = containercheck.run_check(
            wrapper=p["wrapper"], rootfs=p["rootfs"], devices=p["devices"], runner=runner,
            work_dir=p["work_dir"], runc=p["runc"], extra_mounts=mounts)
    except GpuK8sError as err:
        module.fail_json(msg=str(err))
    out = dict(changed=False, output=result.output, driver_version=result.driver_version,
               cuda_version=result.cuda_version, gpus=result.gpus)
    problems = []
    if result.rc != 0:
        problems.append(f"the container exited {result.rc}")
    if p["expect_driver"] and result.driver_version != p["expect_driver"]:
        problems.append(f"nvidia-smi in the container reports driver {result.driver_version}, "
                        f"expected {p['expect_driver']}")
    if p["expect_gpus"] is not None and result.gpus != p["expect_gpus"]:
        problems.append(f"nvidia-smi -L in the container lists {result.gpus} GPU(s), expected "
                        f"{p['expect_gpus']}")
    if problems:
        module.fail_json(msg="nvidia-smi in a container: " + "; ".join(problems), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
