#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: containers on an NVIDIA node get their GPUs and the driver through gpuk8s'
CDI spec and OCI runtime wrapper (the container-runtime agent's code)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_container_runtime
short_description: Set up containerd for NVIDIA GPUs with gpuk8s' CDI spec and runtime wrapper
description:
  - Does on the host what the operator's container-runtime agent does in its pod, with its code
    (C(gpuk8s.services.runtime.agent)) - writes the node's CDI spec
    C(<cdi_dir>/nvidia.com-gpu.json) (every GPU's device node, the control devices, the driver's
    libraries, programs, firmware and IPC sockets, and the hooks that put the libraries in the
    container's ld.so cache), installs the OCI runtime wrapper and, where containerd cannot read
    CDI itself (before 2.0, or 1.7 without C(enable_cdi)), registers it as runtime handler
    O(handler) in containerd's config (the default runtime with O(set_default), as the
    accelerator manual makes C(nvidia) the default) and restarts containerd once.
  - This takes the place of the NVIDIA Container Toolkit's C(nvidia-container-runtime); no
    second containerd editor is involved.
  - O(state=absent) takes all of it back (the containerd config byte for byte when untouched
    since).
  - Needs the Python packages C(tomlkit) (containerd's config is edited in place, comments
    kept) and C(grpcio) (the candidate config is proven by a private containerd whose CRI
    is asked over gRPC) on the node's Python; Debian/Ubuntu C(python3-tomlkit python3-grpcio).
version_added: "0.2.0"
author:
  - gpuk8s contributors
options:
  state:
    description: C(present) sets it up, C(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  host_root:
    description:
      - Directory the node's GPU tree is under (C(/) on a real node; a simulator root in tests).
    type: path
    default: /
  system_root:
    description: Directory the node's containerd config, CDI directory and the wrapper are under.
    type: path
    default: /
  device_path_prefix:
    description:
      - Prefix of the spec's host paths (the simulator root in tests; empty on a real node).
    type: str
    default: ""
  runtime:
    description:
      - C(containerd) - the wrapper where containerd needs it (its version decides); C(cdi) - the
        runtime reads CDI itself, write the spec only.
    type: str
    choices: [containerd, cdi]
    default: containerd
  containerd_version:
    description:
      - containerd's version (C(1.6.20)); default - the version of the containerd serving
        O(containerd_socket) (its own program, which may not be the C(containerd) on PATH),
        else C(containerd --version) on the node's PATH.
    type: str
  containerd_config:
    description: containerd's config file.
    type: path
    default: /etc/containerd/config.toml
  restart_mode:
    description:
      - How containerd picks up its changed config - C(signal) (SIGHUP to the process serving the
        socket), C(systemd), C(none).
    type: str
    choices: [signal, systemd, none]
    default: systemd
  containerd_socket:
    description:
      - containerd's socket - what containerd serves is read back there, and the process
        serving it is signalled with O(restart_mode=signal). With O(restart_mode=none), a
        containerd that does not answer yet is reported in RV(restart_pending), not failed.
    type: path
    default: /run/containerd/containerd.sock
  handler:
    description: The runtime handler name (a RuntimeClass handler).
    type: str
    default: nvidia
  set_default:
    description: Make O(handler) containerd's default runtime.
    type: bool
    default: true
  cdi_dir:
    description: Where the CDI spec goes.
    type: path
    default: /etc/cdi
  install_dir:
    description: Where the wrapper goes on the node.
    type: path
    default: /usr/local/gpuk8s
  host_python:
    description: The python3 (>= 3.8) on the node that runs the wrapper.
    type: path
    default: /usr/bin/python3
  status_dir:
    description: Directory (under O(host_root)) of the C(runtime.ready) marker.
    type: path
    default: /run/metax
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: containerd's config before and after (C(no file) where it is created).
  platform:
    platforms: linux
requirements:
  - tomlkit
  - grpcio
"""

EXAMPLES = r"""
- name: Containers get the GPUs and CUDA through gpuk8s' CDI spec and wrapper
  nvidia_container_runtime:
    handler: nvidia
    set_default: true

- name: Take it back
  nvidia_container_runtime:
    state: absent
"""

RETURN = r"""
mode:
  description: C(wrapper) (the runtime handler is installed) or C(native) (the runtime reads CDI).
  returned: always
  type: str
  sample: wrapper
proof:
  description:
    - How the edit of containerd's config was proven before it replaced the file -
      C(proven with a private containerd <version>), or C(skipped) and why where no private
      containerd could run it (it is then checked after the restart); null when this run
      edited nothing.
  returned: always
  type: str
  sample: proven with a private containerd 1.6.20
spec_path:
  description: The CDI spec file (null when the node has no GPU device yet).
  returned: always
  type: str
  sample: /etc/cdi/nvidia.com-gpu.json
actions:
  description: What was (or would be) done.
  returned: always
  type: list
  elements: str
  sample:
    - write CDI spec /etc/cdi/nvidia.com-gpu.json
    - install the wrapper /usr/local/gpuk8s/bin/gpuk8s-oci-runtime
    - register handler nvidia in /etc/containerd/config.toml and restart containerd
restart_pending:
  description:
    - True when O(restart_mode=none) left containerd running on its old config, or containerd
      is not running yet, so that it does not serve the handler yet (a warning says so);
      restart (or start) containerd to apply it.
  returned: always
  type: bool
  sample: false
message:
  description: The agent's report.
  returned: always
  type: str
  sample: >-
    CDI spec /etc/cdi/nvidia.com-gpu.json with 8 device(s); containers get it through runtime
    handler 'nvidia'
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import GpuK8sError  # noqa: E402
from ansible.module_utils.gpuk8s.discovery.tools import host_path  # noqa: E402

# the runtime wrapper is packed from the modules shipped with this one: it runs these
from ansible.module_utils.gpuk8s.host import cdihook, ociwrapper  # noqa: E402, F401
from ansible.module_utils.gpuk8s.host.nvidia_checks import tool_path, version_tuple  # noqa: E402

try:
    import grpc  # noqa: F401  # asked lazily by the proof; missing it must fail here, by name
    from ansible.module_utils.gpuk8s.services.nodeagent import Reporter
    from ansible.module_utils.gpuk8s.services.runtime import agent as runtime_agent

    # packed for the agent, which imports them relatively
    from ansible.module_utils.gpuk8s.services.runtime import containerd, proof  # noqa: F401
    IMPORT_ERROR = None
except ImportError as err:  # tomlkit or grpcio
    IMPORT_ERROR = err


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def planned(agent):
    """(actions, spec path, diff of containerd's config) a pass would do, read-only: the
    agent's own edit (``candidate``), so that check mode predicts the run."""
    s = agent.settings
    actions = []
    spec = agent.spec()
    path = hooks = None
    if spec is None:
        actions += [f"remove CDI spec {p}" for p in agent.spec_paths() if os.path.exists(p)]
    else:
        path = agent.spec_path(spec["kind"])
        if _read(path) != runtime_agent.spec_text(spec).encode():
            actions.append(f"write CDI spec {path}")
        hooks = (spec.get("containerEdits") or {}).get("hooks") or []
    wrapper = host_path(s.system_root, agent.wrapper_path())
    # the pass installs the wrapper for the handler, and for the spec's hooks that run it
    needs_wrapper = agent.mode() == "wrapper" or any(
        h.get("path") == agent.wrapper_path() for h in hooks or [])
    if needs_wrapper and _read(wrapper) != runtime_agent.wrapper_zip(s.host_python):
        actions.append(f"install the wrapper {agent.wrapper_path()}")
    diff = None
    if agent.mode() == "wrapper":
        config, text, created, result = agent.candidate()  # what the pass writes
        if result.changed:
            # the config, or on containerd 2.x with drop-ins a drop-in of ours
            written = node_path(s.system_root, config)
            actions.append(f"{'create' if created else 'register handler ' + s.handler + ' in'}"
                           f" {written} and restart containerd")
            diff = config_diff(written, None if created else text, result.text)
    return actions, path, diff


def containerd_version(module, system_root, socket):
    """The version of the containerd serving ``socket`` (its own program, as the proof runs
    it: a node may run a containerd 2.x beside the distribution's 1.x on PATH), else of
    ``containerd`` on PATH (not running yet); None when neither answers."""
    serving = proof.node_binary(host_path(system_root, socket))
    if isinstance(serving, tuple):
        found = version_tuple(serving[1])
    else:
        tool = tool_path(system_root, "containerd")
        rc, out, _ = module.run_command([tool, "--version"]) if tool else (1, "", "")
        found = version_tuple(out) if rc == 0 else None
    return ".".join(str(n) for n in found) if found else None


def node_path(system_root, path):
    """``path`` (under ``system_root``, as seen here) as the node names it."""
    return "/" + os.path.relpath(path, system_root).lstrip("/")


def config_diff(path, before, after):
    """Ansible's diff of containerd's config (None: no file)."""
    return {"before": before or "", "after": after or "",
            "before_header": path if before is not None else "(no file)",
            "after_header": path if after is not None else "(removed)"}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            host_root=dict(type="path", default="/"),
            system_root=dict(type="path", default="/"),
            device_path_prefix=dict(type="str", default=""),
            runtime=dict(type="str", choices=["containerd", "cdi"], default="containerd"),
            containerd_version=dict(type="str"),
            containerd_config=dict(type="path", default="/etc/containerd/config.toml"),
            restart_mode=dict(type="str", choices=["signal", "systemd", "none"],
                              default="systemd"),
            containerd_socket=dict(type="path", default="/run/containerd/containerd.sock"),
            handler=dict(type="str", default="nvidia"),
            set_default=dict(type="bool", default=True),
            cdi_dir=dict(type="path", default="/etc/cdi"),
            install_dir=dict(type="path", default="/usr/local/gpuk8s"),
            host_python=dict(type="path", default="/usr/bin/python3"),
            status_dir=dict(type="path", default="/run/metax"),
        ),
        supports_check_mode=True,
    )
    if IMPORT_ERROR is not None:
        missing = "grpcio" if getattr(IMPORT_ERROR, "name", "") == "grpc" else "tomlkit"
        module.fail_json(msg=missing_required_lib(missing), exception=str(IMPORT_ERROR))
    p = module.params
    version = p["containerd_version"]
    if p["runtime"] == "containerd" and not version:
        version = containerd_version(module, p["system_root"], p["containerd_socket"])
    settings = runtime_agent.RuntimeSettings(
        host_root=p["host_root"], system_root=p["system_root"],
        device_path_prefix=p["device_path_prefix"].rstrip("/"), cdi_dir=p["cdi_dir"],
        runtime=p["runtime"], runtime_version=f"containerd://{version}" if version else "",
        containerd_config=p["containerd_config"], containerd_socket=p["containerd_socket"],
        restart_mode=p["restart_mode"], handler=p["handler"], set_default=p["set_default"],
        install_dir=p["install_dir"].rstrip("/"), host_python=p["host_python"],
        status_dir=p["status_dir"],
    )
    agent = runtime_agent.RuntimeAgent(settings, Reporter(None, "container-runtime", "Runtime"))
    try:
        if p["state"] == "absent":
            present = [path for path in agent.spec_paths() if os.path.exists(path)]
            installed = runtime_agent.installed(settings.sys(settings.install_dir))
            config, before, after = agent.uninstalled()
            diff = config_diff(node_path(settings.system_root, config), before, after) \
                if before != after else None
            if module.check_mode:
                actions = [f"remove {path}" for path in present] + (
                    [f"remove {settings.install_dir} and the handler"] if installed else [])
            else:
                actions = agent.uninstall()
            module.exit_json(changed=bool(actions), mode=agent.mode(), spec_path=None, proof=None,
                             restart_pending=False, actions=actions,
                             message="; ".join(actions) or "nothing to remove",
                             **({"diff": diff} if diff and module._diff else {}))
        actions, path, diff = planned(agent)
        message = "; ".join(actions) or "up to date"
        pending = False
        proven = None
        if not module.check_mode:
            report = agent.one_pass()
            # restart_mode none: the administrator restarts containerd; until then it runs
            # its old config (the agent reads that back), which is said, not failed
            pending = report.state == "pending" and p["restart_mode"] == "none"
            if pending:
                module.warn(report.message)
            elif report.state != "ready":
                module.fail_json(msg=report.message, mode=agent.mode(), spec_path=path,
                                 actions=actions)
            message = report.message
            proven = report.details.get("proof")
    except GpuK8sError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=bool(actions), mode=agent.mode(), spec_path=path, actions=actions,
                     restart_pending=pending, message=message, proof=proven,
                     **({"diff": diff} if diff and module._diff else {}))


if __name__ == "__main__":
    main()
