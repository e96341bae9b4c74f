#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: install / upgrade the GPU kernel driver and SDK from a payload."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_driver
short_description: Install or upgrade the GPU kernel driver and SDK, then load it
description:
  - Compares the driver version installed (C(/opt/mxdriver/Version.txt)) and running
    (C(/sys/module/metax/version), as discovery reads it) with O(version), and under
    O(deploy_policy) installs the payload, unloads the old module and loads the new one.
  - C(IfNotPresent) installs when O(version) is not the installed version and loads it
    when it is not the running one; C(Always) reinstalls and reloads on every run;
    C(Never) changes nothing and only reports.
  - Refuses to unload while processes hold GPU devices open (C(/dev/dri/*),
    C(/dev/mxcd), ...) unless O(force=true) - drain the node first.
  - The payload is a directory laid out like the host (copied over O(host_root)), a
    C(.deb), an C(.rpm) or the vendor's C(.run) installer. On C(/) the package manager
    (C(dpkg -i), C(rpm -U)) or the installer runs; under any other O(host_root) the
    package's files are unpacked there (C(dpkg-deb -x), C(rpm2cpio | cpio), C(.run
    --noexec --target)) without package database or maintainer scripts.
  - After loading, the running version is read back; a mismatch fails the task.
    When the new driver cannot be installed or loaded after the old one was
    unloaded, the module tries to load the old one again and says so.
version_added: "0.1.0"
author:
  - gpuk8s contributors
options:
  version:
    description: Wanted driver version, e.g. C(2.33.0.6). Required unless O(deploy_policy=Never).
    type: str
  sdk_version:
    description: When set, the SDK version (C(/opt/maca/Version.txt)) the payload must leave behind.
    type: str
  payload:
    description: The payload, a path on the host. Required unless O(deploy_policy=Never).
    type: path
  payload_kind:
    description:
      - Kind of payload; C(auto) tells from the path (directory, C(.deb), C(.rpm), C(.run)).
    type: str
    choices: [auto, dir, deb, rpm, run]
    default: auto
  run_args:
    description: Arguments for the vendor C(.run) installer on C(/).
    type: list
    elements: str
    default: []
  install_command:
    description:
      - Install with this command instead; placeholders C({payload}) and C({host_root}).
    type: list
    elements: str
  deploy_policy:
    description: When to install (see description).
    type: str
    choices: [IfNotPresent, Always, Never]
    default: IfNotPresent
  module_name:
    description: Kernel module of the driver.
    type: str
    default: metax
  load_command:
    description:
      - Command that loads the kernel module; placeholders C({module}) and C({host_root}).
      - Tests on a simulator root point this at a stand-in that records the load in the
        simulated C(/sys).
    type: list
    elements: str
    default: [modprobe, "{module}"]
  unload_command:
    description: Command that unloads the kernel module; same placeholders.
    type: list
    elements: str
    default: [modprobe, -r, "{module}"]
  force:
    description: Unload even while processes use the GPUs (they will crash).
    type: bool
    default: false
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
- name: Upgrade the driver from a directory payload
  gpu_driver:
    version: 2.33.0.6
    payload: /var/cache/gpuk8s/driver-2.33.0.6

- name: Install the Ubuntu package if this version is not there yet
  gpu_driver:
    version: 2.33.0.6
    payload: /var/cache/gpuk8s/metax-driver_2.33.0.6_amd64.deb

- name: Only report (the admin maintains the driver)
  gpu_driver:
    deploy_policy: Never
"""

RETURN = r"""
before:
  description: Driver and SDK state before the run.
  returned: always
  type: dict
  sample:
    loaded: true
    loaded_version: 2.32.0.6
    installed_version: 2.32.0.6
    sdk_version: 2.32.0.6
after:
  description:
    - Driver and SDK state after the run, read back from the host (the planned state in
      check mode).
  returned: always
  type: dict
  sample:
    loaded: true
    loaded_version: 2.33.0.6
    installed_version: 2.33.0.6
    sdk_version: 3.3.0.15
actions:
  description: Steps done (or that would be done), in order.
  returned: always
  type: list
  elements: str
  sample: [unload metax, install dir /var/cache/gpuk8s/driver-2.33.0.6, load metax]
reason:
  description: Why the module did (or did not) act.
  returned: always
  type: str
  sample: installed 2.2.4, wanted 2.33.0.6
payload_kind:
  description: Kind of payload used (null with deploy_policy Never).
  returned: always
  type: str
  sample: dir
"""

import os  # noqa: E402
import shutil  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpuk8s.ansible import driver as drv  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import ConfigError, GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.discovery import discover  # noqa: E402


def read_state(root):
    inventory = discover(root)
    return drv.DriverState(
        loaded=inventory.driver.loaded,
        loaded_version=inventory.driver.version,
        installed_version=drv.read_version_file(
            os.path.join(root, drv.DRIVER_VERSION_FILE.lstrip("/"))
        ),
        sdk_version=inventory.sdk.version,
    )


def run(module, argv, what):
    rc, out, err = module.run_command(argv)
    if rc != 0:
        raise drv.DriverError(f"{what} failed: `{' '.join(argv)}` exited with {rc}: "
                              f"{(err or out).strip()[-500:]}")


def install(module, kind, params):
    root, payload = params["host_root"], params["payload"]
    if params["install_command"]:
        run(module, drv.expand(params["install_command"], payload=payload, host_root=root),
            "install")
    elif kind == "dir":
        try:
            shutil.copytree(payload, root, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error) as err:
            raise drv.DriverError(f"copying payload {payload} onto {root} failed: {err}") from err
    else:
        for argv in drv.install_commands(kind, payload, root, tuple(params["run_args"])):
            run(module, argv, "install")


def converge(module, decision, before, kind, actions):
    params = module.params
    values = dict(module=params["module_name"], host_root=params["host_root"])
    unloaded = False
    if before.loaded:
        busy = drv.gpu_processes(params["host_root"])
        if busy and not params["force"]:
            raise drv.DriverError(drv.busy_message(busy))
        run(module, drv.expand(params["unload_command"], **values), "unloading the driver")
        unloaded = True
    try:
        if decision.install:
            install(module, kind, params)
        run(module, drv.expand(params["load_command"], **values), "loading the driver")
    except drv.DriverError as err:
        if not unloaded:
            raise
        rc, _, _ = module.run_command(drv.expand(params["load_command"], **values))
        again = "the previous driver was loaded again" if rc == 0 else (
            "loading the previous driver failed too: the node has no GPU driver now")
        raise drv.DriverError(f"{err}; {again}. The node stays as it is: fix the payload and "
                              "rerun, or run the maintenance playbook's rescue steps") from err
    for step in ("unload" if unloaded else None, "install" if decision.install else None, "load"):
        if step:
            actions.append(step)


def planned_after(before, decision, params):
    if not (decision.install or decision.load):
        return before
    return drv.DriverState(
        loaded=True,
        loaded_version=params["version"],
        installed_version=params["version"] if decision.install else before.installed_version,
        sdk_version=params["sdk_version"] or before.sdk_version,
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            version=dict(type="str"),
            sdk_version=dict(type="str"),
            payload=dict(type="path"),
            payload_kind=dict(type="str", choices=["auto", *drv.KINDS], default="auto"),
            run_args=dict(type="list", elements="str", default=[]),
            install_command=dict(type="list", elements="str"),
            deploy_policy=dict(type="str", choices=list(drv.POLICIES), default="IfNotPresent"),
            module_name=dict(type="str", default="metax"),
            load_command=dict(type="list", elements="str", default=["modprobe", "{module}"]),
            unload_command=dict(type="list", elements="str",
                                default=["modprobe", "-r", "{module}"]),
            force=dict(type="bool", default=False),
            host_root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    actions = []
    kind = None
    try:
        drv.check_version("version", params["version"])
        drv.check_version("sdk_version", params["sdk_version"])
        before = read_state(params["host_root"])
        decision = drv.decide(params["deploy_policy"], params["version"], before)
        if decision.install:
            if not params["payload"]:
                raise ConfigError(f"payload is required to install {params['version']} "
                                  f"(deploy_policy {params['deploy_policy']})")
            kind = drv.payload_kind(params["payload"], params["payload_kind"])
        after = planned_after(before, decision, params)
        changed = decision.install or decision.load
        if changed and module.check_mode:
            actions = [s for s, on in (("unload", before.loaded), ("install", decision.install),
                                       ("load", True)) if on]
        elif changed:
            converge(module, decision, before, kind, actions)
            after = read_state(params["host_root"])
            if not drv.same_version(after.loaded_version, params["version"]):
                raise drv.DriverError(
                    f"after loading, the running driver is {after.loaded_version or 'none'}, "
                    f"wanted {params['version']}: the payload does not hold that version, or "
                    "the kernel refused it (check dmesg)"
                )
            if params["sdk_version"] and not drv.same_version(after.sdk_version,
                                                              params["sdk_version"]):
                raise drv.DriverError(
                    f"SDK version is {after.sdk_version or 'none'} after installing, wanted "
                    f"{params['sdk_version']}: the payload lacks opt/maca/Version.txt or holds "
                    "another SDK"
                )
    except GpuK8sError as err:
        module.fail_json(msg=str(err), actions=actions)
    result = dict(
        changed=changed,
        before=before.to_dict(),
        after=after.to_dict(),
        actions=actions,
        reason=decision.reason,
        payload_kind=kind,
    )
    if module._diff:
        result["diff"] = dict(
            before="".join(f"{k}: {v}\n" for k, v in before.to_dict().items()),
            after="".join(f"{k}: {v}\n" for k, v in after.to_dict().items()),
            before_header="driver", after_header="driver",
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
