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
  - C(IfNotPresent) installs only where no driver is loaded (a loaded driver is left
    alone, whatever its version; an installed O(version) that is not loaded is loaded);
    C(Always) converges to O(version) (install and reload unless it is both installed and
    running); C(Never) changes nothing and only reports.
  - An install a killed run left behind (this module's or the operator's driver-manager's,
    e.g. after an operator uninstall during a driver upgrade) is finished or rolled back
    first; check mode reports it as a change (RV(recovered)), so node_maintenance's plan
    does not skip such a node.
  - Refuses to unload while processes hold GPU devices open (C(/dev/dri/*),
    C(/dev/mxcd), ...) unless O(force=true) - drain the node first.
  - The payload is a directory laid out like the host (copied over O(host_root)), a
    C(.deb), an C(.rpm) or the vendor's C(.run) installer. On C(/) the package manager
    (C(dpkg -i), C(rpm -U)) or the installer runs; under any other O(host_root) the
    package's files are unpacked there (C(dpkg-deb -x), C(rpm2cpio | cpio), C(.run
    --noexec --target)) without package database or maintainer scripts.
  - A directory payload is checked before anything is touched, that is before the running
    driver is unloaded. Its C(opt/mxdriver/Version.txt) must exist and say O(version). It
    must hold the kernel module under C(lib/modules/<release>/) for the kernel release the
    host runs (C(/proc/sys/kernel/osrelease) of O(host_root), what C(uname -r) prints), and
    every module there must have been built for it (the C(vermagic) in the module's
    C(.modinfo)). A mismatch fails naming both releases. A package under a O(host_root)
    other than C(/) is unpacked and checked the same way, before the unload.
  - The payload is copied file by file with a backup and a journal under
    C(/var/lib/gpuk8s). Then C(depmod) runs for the running release (O(depmod_command)).
    Any later failure restores the previous files, C(modules.dep) and ownership record. It
    also unloads a new module that got loaded, and loads the previous driver again. The
    next run after a crash (kill -9) does the same.
  - After loading, the running version is read back; a mismatch fails the task (and is
    rolled back as above).
  - The procedure is C(gpuk8s.host.driver), the same code the operator's driver-manager
    runs.
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
  resolve_command:
    description:
      - kmod's own lookup of the file C(modprobe) would load for the module on O(host_root)
        (C(insmod PATH) lines), asked after the new files are in place and before the
        running driver is unloaded; the install refuses, with every file put back and the
        running driver untouched, when kmod would load another file than the payload's (a
        DKMS build under C(updates/), an older module beside it) or a module whose
        C(.modinfo) version is not O(version). Placeholders C({host_root}),
        C({kernel_release}) and C({module}).
      - Default the program of O(load_command) (when it ends with C({module})) asked with
        C(--show-depends -d {host_root} -S {kernel_release} {module}), else C(modprobe) so.
    type: list
    elements: str
  depmod_command:
    description:
      - Command that indexes the installed module for the running kernel release (kmod's
        C(modprobe) finds modules only through C(modules.dep)); placeholders
        C({kernel_release}) (the running kernel, C(uname -r) of O(host_root)),
        C({host_root}) and C({module}).
      - Default C(depmod -a {kernel_release}) on C(/), C(depmod -a -b {host_root}
        {kernel_release}) under any other O(host_root).
    type: list
    elements: str
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
recovered:
  description:
    - What was done first about a driver install a killed run left behind (the journal
      under C(/var/lib/gpuk8s)), or in check mode what would be; empty when there was
      none. Such a run counts as changed, and its actions start with C(recover).
  returned: always
  type: str
  sample: "rolled back an interrupted driver install: the previous driver files were restored"
payload_kind:
  description: Kind of payload used (null with deploy_policy Never).
  returned: always
  type: str
  sample: dir
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.host import driver as drv  # noqa: E402


def request_from(params):
    return drv.InstallRequest(
        policy=params["deploy_policy"], version=params["version"], payload=params["payload"],
        payload_kind=params["payload_kind"], run_args=tuple(params["run_args"]),
        install_command=tuple(params["install_command"] or ()) or None,
        module=params["module_name"], load_command=tuple(params["load_command"]),
        unload_command=tuple(params["unload_command"]),
        depmod_command=tuple(params["depmod_command"] or ()) or None, force=params["force"],
        resolve_command=tuple(params["resolve_command"] or ()) or None,
        sdk_version=params["sdk_version"],
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
            load_command=dict(type="list", elements="str", default=list(drv.DEFAULT_LOAD)),
            unload_command=dict(type="list", elements="str", default=list(drv.DEFAULT_UNLOAD)),
            depmod_command=dict(type="list", elements="str"),
            resolve_command=dict(type="list", elements="str"),
            force=dict(type="bool", default=False),
            host_root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    root = module.params["host_root"]
    request = request_from(module.params)

    def runner(argv):
        return module.run_command(argv)

    try:
        # an install a killed run left (driver-manager's or this module's) comes first;
        # check mode only says so: what follows is planned from the host as it is now
        if module.check_mode:
            recovered = drv.interrupted(root)
        else:
            recovered = drv.recover(root, request, runner)
            if recovered:
                module.warn(recovered)
        before, decision, kind = drv.plan(root, request, runner)
        if module.check_mode or not decision.changes:
            outcome = drv.Outcome(before, drv.planned_after(before, decision, request), decision,
                                  kind, drv.planned_actions(before, decision) if
                                  decision.changes else [])
        else:
            outcome = drv.converge(root, request, runner)
    except GpuK8sError as err:
        done = getattr(err, "outcome", None)
        module.fail_json(msg=str(err), actions=done.actions if done else [])
    result = dict(
        changed=outcome.changed or bool(recovered),
        before=outcome.before.to_dict(),
        after=outcome.after.to_dict(),
        actions=(["recover"] if recovered else []) + outcome.actions,
        reason=outcome.decision.reason,
        recovered=recovered or "",
        payload_kind=outcome.kind,
    )
    if module._diff:
        result["diff"] = dict(
            before="".join(f"{k}: {v}\n" for k, v in outcome.before.to_dict().items()),
            after="".join(f"{k}: {v}\n" for k, v in outcome.after.to_dict().items()),
            before_header="driver", after_header="driver",
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
