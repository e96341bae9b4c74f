#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: an NVIDIA node's facts and the accelerator manual's prerequisite checks."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_host_facts
short_description: Read an NVIDIA node and check the accelerator manual's prerequisites
description:
  - Reads the node - NVIDIA GPUs on the PCI bus (sysfs; C(lspci) lines when it is installed),
    their names and CUDA compute capabilities, the driver (loaded version, the CUDA version it
    supports, whether C(nvidia-smi) answers), the build prerequisites of a driver install
    (C(gcc), C(dkms), the running kernel's headers), OS, NVIDIA Container Toolkit,
    containerd / docker, the kubelet's version, C(--allow-privileged) of a kube-apiserver
    static pod, the kubelet's C(DevicePlugins) feature gate - and sets them as the fact
    C(nvidia_host).
  - Evaluates the prerequisite checks named in O(checks) (C(gpuk8s.host.nvidia_checks), the
    same code the services use) and returns each with C(ok) and a message naming what is
    missing. With O(fail_on_missing) the module fails listing every failed check.
  - Read-only; C(changed) is always false.
version_added: "0.2.0"
author:
  - gpuk8s contributors
options:
  host_root:
    description:
      - Directory the node's GPU tree (sysfs, driver, tools) is under (C(/) on a real node; a
        simulator root in tests).
    type: path
    default: /
  system_root:
    description:
      - Directory the node's container runtime, kubelet and python3 are under. Default
        O(host_root); differs only where the GPU tree is simulated (the lab).
    type: path
  kubernetes_version:
    description:
      - The node's Kubernetes version, when the node has no kubelet to ask (C(kubelet --version)).
    type: str
  containerd_socket:
    description:
      - The node's containerd socket (as the node names it). The containerd asked for its
        version is the process serving it (C(gpuk8s.host.serving), as C(nvidia_container_runtime)
        finds it); where nothing visible serves it, the running process called C(containerd),
        else C(containerd) on PATH.
    type: path
    default: /run/containerd/containerd.sock
  host_python:
    description: The python3 gpuk8s' runtime wrapper runs with (checked for >= 3.8).
    type: path
    default: /usr/bin/python3
  scheme:
    description:
      - C(operator) adds the operator scheme's checks (container runtime versions, host OS,
        C(--allow-privileged)).
    type: str
    choices: [extensions, operator]
    default: extensions
  runtime:
    description:
      - How containers get the GPUs - C(gpuk8s) (the project's CDI spec and runtime wrapper, in
        place of the NVIDIA Container Toolkit) or C(toolkit) (NVIDIA Container Toolkit >= 1.7.0).
    type: str
    choices: [gpuk8s, toolkit]
    default: gpuk8s
  mps:
    description: The node will run MPS (checks Volta or newer and a driver for CUDA >= 11.5).
    type: bool
    default: false
  cuda_runtime:
    description:
      - The applications' CUDA runtime (C(12.4)); checks the driver's CUDA version is at least that.
    type: str
  checks:
    description:
      - The checks to evaluate (those that do not apply to O(scheme), O(mps), O(cuda_runtime)
        are left out). Default all.
    type: list
    elements: str
    choices: [kubernetes, device_plugins, nvidia_gpu, nvidia_smi, container_toolkit, mps, cuda,
              container_runtime, host_os, allow_privileged]
  fail_on_missing:
    description: Fail when a check fails (the message lists every failed check).
    type: bool
    default: false
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
- name: Read the node and check everything the manual lists
  nvidia_host_facts:
    scheme: operator
    mps: true
    cuda_runtime: "12.4"
    fail_on_missing: true

- name: Only what a driver install needs
  nvidia_host_facts:
    checks: [nvidia_gpu]
  register: nvidia_host_probe
"""

RETURN = r"""
ansible_facts:
  description: The node's facts, under C(nvidia_host).
  returned: always
  type: dict
  contains:
    nvidia_host:
      description: Everything read (see the description); C(gpus) lists the NVIDIA GPUs on the bus.
      type: dict
      sample:
        kernel: 5.15.0-91-generic
        os_id: ubuntu
        gpus: [{index: 0, name: NVIDIA H100 80GB HBM3, compute_capability: "9.0"}]
        driver_version: 550.54.15
        driver_cuda: "12.4"
        nvidia_smi: {ok: true, driver_version: 550.54.15, cuda_version: "12.4", gpus: 8}
checks:
  description: The checks evaluated, in order.
  returned: always
  type: list
  elements: dict
  sample:
    - name: mps
      ok: false
      message: >-
        MPS needs a Volta or newer GPU (compute capability >= 7.0); GPU 0
        (Tesla P100-PCIE-16GB) has 6.0
failed_checks:
  description: Names of the checks that failed.
  returned: always
  type: list
  elements: str
  sample: [mps]
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.host import nvidia_checks  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host_root=dict(type="path", default="/"),
            system_root=dict(type="path"),
            kubernetes_version=dict(type="str"),
            containerd_socket=dict(type="path", default=nvidia_checks.CONTAINERD_SOCKET),
            host_python=dict(type="path", default="/usr/bin/python3"),
            scheme=dict(type="str", choices=list(nvidia_checks.SCHEMES), default="extensions"),
            runtime=dict(type="str", choices=list(nvidia_checks.RUNTIMES), default="gpuk8s"),
            mps=dict(type="bool", default=False),
            cuda_runtime=dict(type="str"),
            checks=dict(type="list", elements="str", choices=list(nvidia_checks.CHECKS)),
            fail_on_missing=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params

    def runner(argv):
        return module.run_command(argv)

    try:
        wants = nvidia_checks.Wants(p["scheme"], p["runtime"], p["mps"], p["cuda_runtime"])
        facts = nvidia_checks.gather(p["host_root"], runner, system_root=p["system_root"],
                                     kubernetes_version=p["kubernetes_version"],
                                     host_python=p["host_python"],
                                     containerd_socket=p["containerd_socket"])
        checks = nvidia_checks.evaluate(facts, wants, p["checks"])
    except GpuK8sError as err:
        module.fail_json(msg=str(err))
    results = [dict(name=c.name, ok=c.ok, message=c.message) for c in checks]
    failed = [c for c in checks if not c.ok]
    out = dict(changed=False, ansible_facts=dict(nvidia_host=facts.to_dict()), checks=results,
               failed_checks=[c.name for c in failed])
    if failed and p["fail_on_missing"]:
        module.fail_json(msg="prerequisites missing: " + "; ".join(
            f"{c.name}: {c.message}" for c in failed), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
