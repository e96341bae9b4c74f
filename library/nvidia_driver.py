#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: install the NVIDIA driver with NVIDIA's .run installer, as the accelerator
manual does, with rollback."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver
short_description: Install the NVIDIA driver from its .run installer (with DKMS), with rollback
description:
  - The accelerator manual's driver install (blocks 002-34 to 002-39) - checks an NVIDIA GPU is
    on the PCI bus, installs the build prerequisites the node lacks (C(gcc), C(dkms), the
    running kernel's headers - C(linux-headers-<kernel>) on Debian/Ubuntu,
    C(kernel-devel-<kernel>) on EL), runs C(<installer> --dkms --silent), then checks that
    C(nvidia-smi) answers with the new version and lists every NVIDIA GPU on the bus.
  - Nothing to do when C(nvidia-smi) already answers with the installer's version for every GPU.
  - Any failure from the installer on is rolled back - C(nvidia-uninstall --silent) (or
    C(<installer> --uninstall --silent)), then O(previous_installer) when given, checked the
    same way - and the task fails saying what the node has now. A journal under
    C(/var/lib/gpuk8s) lets the next run finish a rollback interrupted by a crash.
  - The procedure is C(gpuk8s.host.nvidia_driver).
version_added: "0.2.0"
author:
  - gpuk8s contributors
options:
  installer:
    description:
      - The driver's C(NVIDIA-Linux-<arch>-<version>.run) on the node (a path under O(host_root));
        the manual downloads it into C(/home/gpu).
    type: path
    required: true
  version:
    description: The driver version; default - read from the installer's file name.
    type: str
  dkms:
    description: Register the kernel module with DKMS (C(--dkms)), so kernel updates rebuild it.
    type: bool
    default: true
  packages:
    description:
      - The build prerequisites to install when some are missing; default by OS (see the
        description).
    type: list
    elements: str
  package_command:
    description:
      - The command that installs O(packages) (the packages are appended); default C(apt-get install
        -y) or C(yum install -y).
    type: list
    elements: str
  previous_installer:
    description:
      - The installer of the driver to reinstall when the new one fails (a path under O(host_root)).
    type: path
  host_root:
    description:
      - Directory the node's files are under (C(/) on a real node; a simulator root in tests).
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
- name: Install driver 550.54.15 as the manual does (dkms, gcc, headers first)
  nvidia_driver:
    installer: /home/gpu/NVIDIA-Linux-x86_64-550.54.15.run

- name: Upgrade, and go back to the running driver if the new one fails
  nvidia_driver:
    installer: /home/gpu/NVIDIA-Linux-x86_64-550.54.15.run
    previous_installer: /home/gpu/NVIDIA-Linux-x86_64-535.183.01.run
"""

RETURN = r"""
version:
  description: The driver version the installer carries.
  returned: always
  type: str
  sample: 550.54.15
before:
  description: The driver C(nvidia-smi) reported before (null when it did not answer).
  returned: always
  type: str
  sample: 535.183.01
after:
  description: The driver C(nvidia-smi) reports afterwards (the planned one in check mode).
  returned: always
  type: str
  sample: 550.54.15
missing_packages:
  description: Build prerequisites that were (or would be) installed first.
  returned: always
  type: list
  elements: str
  sample: [dkms, linux-headers-5.15.0-91-generic]
actions:
  description:
    - Steps done (or that would be done), in order; on failure, those done before and during the
      rollback.
  returned: always
  type: list
  elements: str
  sample: [install dkms, run NVIDIA-Linux-x86_64-550.54.15.run --dkms --silent, check nvidia-smi]
reason:
  description: Why the module did (or did not) act.
  returned: always
  type: str
  sample: nvidia-smi reports driver 535.183.01, wanted 550.54.15
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.host import nvidia_driver as drv  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            installer=dict(type="path", required=True),
            version=dict(type="str"),
            dkms=dict(type="bool", default=True),
            packages=dict(type="list", elements="str"),
            package_command=dict(type="list", elements="str"),
            previous_installer=dict(type="path"),
            host_root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    root = p["host_root"]
    request = drv.DriverRequest(
        installer=p["installer"], version=p["version"], dkms=p["dkms"],
        packages=tuple(p["packages"]) if p["packages"] is not None else None,
        package_command=tuple(p["package_command"]) if p["package_command"] else None,
        previous_installer=p["previous_installer"],
    )

    def runner(argv):
        return module.run_command(argv)

    try:
        if not module.check_mode:
            recovered = drv.recover(root, runner)
            if recovered:
                module.warn(recovered)
        # check mode: the installer may be copied there by an earlier task that did not run
        plan = drv.plan(root, request, runner, require_installer=not module.check_mode)
        if module.check_mode or not plan.install:
            changed, actions, after = plan.install, list(plan.actions), plan.version
            if not plan.install:
                after = plan.installed
        else:
            outcome = drv.converge(root, request, runner)
            changed, actions, after = outcome.changed, outcome.actions, outcome.after
    except drv.NvidiaDriverError as err:
        module.fail_json(msg=str(err), actions=err.actions)
    except GpuK8sError as err:
        module.fail_json(msg=str(err), actions=[])
    result = dict(changed=changed, version=plan.version, before=plan.installed, after=after,
                  missing_packages=list(plan.missing), actions=actions, reason=plan.reason)
    if module._diff:
        result["diff"] = dict(before=f"driver: {plan.installed}\n", after=f"driver: {after}\n",
                              before_header="nvidia-smi", after_header="nvidia-smi")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
