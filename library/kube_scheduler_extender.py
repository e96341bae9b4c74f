#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: enable / disable the gpu-aware scheduler extender on a control-plane node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kube_scheduler_extender
short_description: Add or remove a kube-scheduler extender on a kubeadm-style control-plane node
description:
  - Writes a C(KubeSchedulerConfiguration) with one extender (default file
    C(/etc/metax/extender.yaml)) and patches the static-pod manifest
    C(/etc/kubernetes/manifests/kube-scheduler.yaml) to use it - the C(--config) argument,
    read-only volumeMounts and hostPath volumes for the configuration and the scheduler
    kubeconfig.
  - The configuration C(apiVersion) follows the scheduler the manifest runs -
    C(kubescheduler.config.k8s.io/v1) for Kubernetes 1.25 and newer, C(v1beta3) for
    1.23-1.24, C(v1beta2) for 1.22 - read from the tag of the scheduler image; O(kubernetes_version)
    is needed only when that tag is not a version, and must agree with it otherwise.
  - kube-scheduler reads its configuration only at start and the kubelet restarts a static
    pod only when its manifest changes, so the pod gets the annotation
    C(metax-tech.com/scheduler-extender) holding the hash of the configuration file (and our
    URL, and whether the C(--config) argument is ours); any change of the file changes the
    manifest and RV(manifest_changed) is true. Wait for the new scheduler pod (the gpu_aware
    role does).
  - When the scheduler already runs with a C(--config) of its own - another file, or
    O(config_path) itself set up by hand as the manual shows - the extender is added to that
    file's C(extenders) (or updated in place - the entry a previous run wrote, recognised by
    the content the annotation records, even when the URL changed), and the administrator's
    argument, volumes and other entries are never touched - an entry written by hand stays
    as it is even at our URL, and ours is appended beside it with a warning (the manual's
    "if the file already has extenders, append this one"); O(state=absent) removes our
    entry and our annotation only, and without our annotation (a second disable) nothing.
  - A path the scheduler must read (the configuration, the kubeconfig, the tlsConfig files)
    is mounted only when no other hostPath mount already shows it, so no mountPath appears
    twice.
  - The tlsConfig files must exist on the host (the task fails otherwise, nothing written);
    kube-scheduler reads them only at start, so their content is part of the annotation -
    renewed certificates change the manifest and the kubelet restarts the scheduler.
  - YAML is round-tripped - comments, key order and indentation are kept - and
    O(state=absent) removes exactly what O(state=present) added, so enabling and then
    disabling gives back the original bytes.
  - Every file is rendered, re-parsed and checked (and passed to O(validate)) before it
    atomically replaces the original; a malformed manifest is an error and nothing is
    written. Backups go to O(backup_dir), never next to the manifest, because the kubelet
    would start any extra file in the manifests directory as a second scheduler pod.
version_added: "0.1.0"
author:
  - gpuk8s contributors
options:
  state:
    description: Whether the extender is configured.
    type: str
    choices: [present, absent]
    default: present
  url_prefix:
    description:
      - Address of the extender, e.g. C(http://10.96.12.34:8080) (the gpu-aware Service).
      - Required with O(state=present). With O(state=absent) it is never needed, the
        manifest's annotation records the entry this module wrote (URL and content), and
        only that entry is removed from the administrator's own C(--config) file. Without
        that record (never enabled, or disabled already) nothing is removed; an entry at
        this URL (or managing one of O(managed_resources)) is left with a warning.
    type: str
  filter_verb:
    description: Path of the filter call; empty to not filter.
    type: str
    default: filter
  prioritize_verb:
    description: Path of the prioritize call; empty to not prioritize.
    type: str
    default: prioritize
  bind_verb:
    description:
      - Path of the bind call; empty (the default) to leave binding to the scheduler.
      - C(bind) lets gpu-aware choose the GPU of a shared-GPU pod, record it on the pod and
        bind it (GPU sharing). Only one extender of a scheduler may bind.
      - Needs O(managed_resources) - gpu-aware binds only the GPU pods its filter placed.
    type: str
    default: ""
  weight:
    description: Multiplier of the extender's scores; must be positive with a prioritize verb.
    type: int
    default: 500
  enable_https:
    description: Call the extender over HTTPS (O(url_prefix) must then be C(https://)).
    type: bool
    default: false
  tls_config:
    description: TLS settings when O(enable_https=true).
    type: dict
    suboptions:
      insecure:
        description: Skip verification of the extender's certificate.
        type: bool
        default: false
      server_name:
        description:
          - Name the extender's certificate must hold when O(url_prefix) names it by IP
            address (gpu-aware's chart - C(gpu-aware.<namespace>.svc)).
        type: str
      cert_file:
        description:
          - Client certificate file (absolute path on the control-plane node; it must
            exist). It and the other files are mounted read-only into the scheduler pod at
            the same path.
        type: str
      key_file:
        description: Client key file.
        type: str
      ca_file:
        description:
          - CA bundle that signed the extender's certificate. Without it kube-scheduler
            does not verify the extender at all (it sets insecure itself).
        type: str
  http_timeout:
    description:
      - Timeout of each extender call as a duration (C(5s), C(1m30s)); scheduler default 5s.
    type: str
  node_cache_capable:
    description:
      - The extender caches nodes itself (gpu-aware C(--node-cache), which the chart
        runs, with RBAC C(get), C(list), C(watch) on nodes and pods) and receives only
        node names.
      - C(false) is the manual's setting (SPEC §7); every call then carries every
        candidate Node object, several times slower on large clusters.
    type: bool
    default: true
  ignorable:
    description: Scheduling goes on when the extender fails or is unreachable.
    type: bool
    default: false
  rank_pods_without_gpus:
    description:
      - Also write a second entry for the same extender, prioritize only (verb
        C(prioritize-nogpu)), ignorable and without managedResources, so kube-scheduler
        asks it about every pod and gpu-aware ranks the pods without GPUs where their CPU
        and memory strand the least GPU capacity (GPU sharing; docs/extender.md). Pods
        without GPUs never wait for it - the entry is ignorable and kube-scheduler ignores
        a failed prioritize call.
    type: bool
    default: false
  managed_resources:
    description:
      - Extended resources the extender manages; pods are sent to it only when they
        request one of them. Empty sends every pod.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Resource name, e.g. C(metax-tech.com/gpu).
        type: str
        required: true
      ignored_by_scheduler:
        description: The scheduler skips its own fit check for this resource.
        type: bool
        default: false
  scheduler_profile:
    description:
      - Scheduler settings written next to the extender in O(config_path). In a
        configuration file the administrator owns, each top-level key of the profile
        (C(percentageOfNodesToScore), C(profiles)) the file lacks is written and recorded in
        the annotation, and removed again by O(state=absent) (or V(none)); a key the
        administrator set is left as it is, with a warning, and so is one of those keys
        edited since (no longer recorded).
      - C(packing) - C(percentageOfNodesToScore 100), so the extender ranks every
        feasible node, and C(NodeResourcesFit) scoring C(MostAllocated) on
        C(metax-tech.com/gpu) alone, so the scheduler's own scorers break the extender's
        ties by filling GPU nodes instead of spreading GPU pods (pods without GPUs get no
        score from it).
      - C(none) - the scheduler's defaults.
    type: str
    choices: [packing, none]
    default: packing
  tls_files_pending:
    description:
      - The tlsConfig files are replaced earlier in the same run (the gpu_aware role copies
        them first). In check mode, where they are not written yet, their content is not
        read (a missing file is no error) and the manifest is predicted to change, as the
        real run's does when new files restart the scheduler. Without check mode it changes
        nothing.
    type: bool
    default: false
  kubernetes_version:
    description:
      - Kubernetes version of the control plane (C(v1.29.3), C(1.29)); picks the
        configuration apiVersion when the scheduler image tag is not a version. When the
        tag is one, both must select the same apiVersion, else the task fails and nothing
        is written.
    type: str
  manifest_path:
    description: The kube-scheduler static-pod manifest, as a path on the host.
    type: path
    default: /etc/kubernetes/manifests/kube-scheduler.yaml
  config_path:
    description:
      - The configuration file this module owns, as a path on the host (and in the pod).
      - A file already there that the manifest does not name in C(--config) and that this
        module has no record of writing is never replaced (V(present) fails, naming it)
        nor removed (V(absent) leaves it, with a warning).
    type: path
    default: /etc/metax/extender.yaml
  kubeconfig:
    description: Scheduler kubeconfig named in C(clientConnection.kubeconfig) and mounted read-only.
    type: path
    default: /etc/kubernetes/scheduler.conf
  host_root:
    description: Directory the host's files are under (C(/) on a real host; a copy in tests).
    type: path
    default: /
  backup:
    description: Copy every file to O(backup_dir) before changing or removing it.
    type: bool
    default: false
  backup_dir:
    description: Where backups go (a path on the host, created if missing).
    type: path
    default: /var/lib/gpuk8s/backups
  validate:
    description:
      - Command run on each rendered file before it replaces the original; C(%s) is the
        temporary file. A non-zero exit aborts and nothing is written.
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
requirements:
  - ruamel.yaml on the host (Debian/Ubuntu C(python3-ruamel.yaml), RHEL C(python3-ruamel-yaml))
notes:
  - The kubelet restarts the scheduler pod when the manifest changes; wait for it
    (the gpu_aware role does).
  - A Python older than 3.8 on the host gets a clear error from the action plugin of the
    same name (action_plugins/).
"""

EXAMPLES = r"""
- name: Enable the gpu-aware extender
  kube_scheduler_extender:
    url_prefix: "http://{{ gpu_aware_service_ip }}:8080"
    managed_resources:
      - name: metax-tech.com/gpu
    backup: true

- name: Second manual's variant - HTTPS through the apiserver proxy, ignorable
  kube_scheduler_extender:
    url_prefix: https://10.96.0.1/api/v1/namespaces/metax-gpu-extensions/services/gpu-aware:8080/proxy
    filter_verb: predicates
    enable_https: true
    tls_config:
      insecure: false
      ca_file: /etc/kubernetes/pki/ca.crt
      cert_file: /etc/kubernetes/pki/apiserver-kubelet-client.crt
      key_file: /etc/kubernetes/pki/apiserver-kubelet-client.key
    http_timeout: 30s
    ignorable: true

- name: Disable it again (removes exactly what was added)
  kube_scheduler_extender:
    state: absent
"""

RETURN = r"""
state:
  description: The requested state.
  returned: always
  type: str
  sample: present
mode:
  description: C(own) when the extender lives in O(config_path); C(appended) when it was
    added to the scheduler's existing C(--config) file.
  returned: always
  type: str
  sample: own
api_version:
  description: apiVersion of the configuration file holding the extender (null after removing ours).
  returned: always
  type: str
  sample: kubescheduler.config.k8s.io/v1
manifest_path:
  description: The manifest, as a path on the host.
  returned: always
  type: str
  sample: /etc/kubernetes/manifests/kube-scheduler.yaml
config_path:
  description: The configuration file holding (or that held) the extender, as the scheduler sees it.
  returned: always
  type: str
  sample: /etc/metax/extender.yaml
changes:
  description: What changed (or would change), one line each.
  returned: always
  type: list
  elements: str
  sample: ["command: added --config=/etc/metax/extender.yaml"]
files:
  description: Files written or removed (paths under O(host_root)).
  returned: always
  type: list
  elements: str
  sample: [/etc/metax/extender.yaml, /etc/kubernetes/manifests/kube-scheduler.yaml]
manifest_changed:
  description: Whether the manifest changed (the scheduler pod restarts when it does); true
    whenever the configuration the scheduler reads changed.
  returned: always
  type: bool
  sample: true
backup_files:
  description: Backups written, one per changed file that existed.
  returned: always
  type: list
  elements: str
  sample: [/var/lib/gpuk8s/backups/kube-scheduler.yaml.20260101T000000Z~]
"""

import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible.module_utils.gpuk8s.ansible import schedfiles  # noqa: E402
from ansible.module_utils.gpuk8s.core import schedconf  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import (  # noqa: E402
    ConfigError,
    GpuK8sError,
    ManifestError,
)


def argument_spec():
    return dict(
        state=dict(type="str", choices=["present", "absent"], default="present"),
        url_prefix=dict(type="str"),
        filter_verb=dict(type="str", default="filter"),
        prioritize_verb=dict(type="str", default="prioritize"),
        bind_verb=dict(type="str", default=""),
        weight=dict(type="int", default=500),
        enable_https=dict(type="bool", default=False),
        tls_config=dict(
            type="dict",
            options=dict(
                insecure=dict(type="bool", default=False),
                server_name=dict(type="str"),
                cert_file=dict(type="str"),
                key_file=dict(type="str"),
                ca_file=dict(type="str"),
            ),
        ),
        http_timeout=dict(type="str"),
        node_cache_capable=dict(type="bool", default=True),
        ignorable=dict(type="bool", default=False),
        rank_pods_without_gpus=dict(type="bool", default=False),
        managed_resources=dict(
            type="list",
            elements="dict",
            default=[],
            options=dict(
                name=dict(type="str", required=True),
                ignored_by_scheduler=dict(type="bool", default=False),
            ),
        ),
        scheduler_profile=dict(type="str", choices=list(schedconf.PROFILES), default="packing"),
        tls_files_pending=dict(type="bool", default=False),
        kubernetes_version=dict(type="str"),
        manifest_path=dict(type="path", default=schedconf.DEFAULT_MANIFEST),
        config_path=dict(type="path", default=schedconf.DEFAULT_CONFIG_PATH),
        kubeconfig=dict(type="path", default=schedconf.DEFAULT_KUBECONFIG),
        host_root=dict(type="path", default="/"),
        backup=dict(type="bool", default=False),
        backup_dir=dict(type="path", default="/var/lib/gpuk8s/backups"),
        validate=dict(type="str"),
    )


def spec_from_params(params):
    """The ExtenderSpec the parameters describe (None for state=absent)."""
    if params["state"] != "present":
        return None
    if not params["url_prefix"]:
        raise ConfigError("url_prefix is required with state=present (e.g. http://10.96.0.50:8080)")
    tls = params["tls_config"]
    spec = schedconf.ExtenderSpec(
        url_prefix=params["url_prefix"],
        filter_verb=params["filter_verb"] or None,
        prioritize_verb=params["prioritize_verb"] or None,
        bind_verb=params["bind_verb"] or None,
        weight=params["weight"],
        enable_https=params["enable_https"],
        tls_config=None if tls is None else schedconf.TlsConfig(**tls),
        http_timeout=params["http_timeout"] or None,
        node_cache_capable=params["node_cache_capable"],
        ignorable=params["ignorable"],
        managed_resources=tuple(
            schedconf.ManagedResource(r["name"], r["ignored_by_scheduler"])
            for r in params["managed_resources"]
        ),
        rank_nogpu=params["rank_pods_without_gpus"],
    )
    spec.validate()
    return spec


def request_from_params(params, check_mode=False):
    return schedfiles.Request(
        state=params["state"],
        spec=spec_from_params(params),
        url_prefix=params["url_prefix"],
        manifest_path=params["manifest_path"],
        config_path=params["config_path"],
        kubeconfig=params["kubeconfig"],
        kubernetes_version=params["kubernetes_version"],
        host_root=params["host_root"],
        managed_resources=tuple(r["name"] for r in params["managed_resources"]),
        profile=params["scheduler_profile"],
        tls_pending=check_mode and params["tls_files_pending"],
    )


def backup_file(path, backup_dir):
    """Copy ``path`` into ``backup_dir`` (mode kept); the backup's path."""
    os.makedirs(backup_dir, mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = os.path.join(backup_dir, f"{os.path.basename(path)}.{stamp}.{os.getpid()}~")
    shutil.copy2(path, target)
    return target


def run_validate(module, command, path):
    if "%s" not in command:
        raise ConfigError(f"validate {command!r} must contain %s (the file to check)")
    rc, out, err = module.run_command(command % path)
    if rc != 0:
        raise ManifestError(
            f"validate {command!r} rejected the rendered {path} (rc {rc}): "
            f"{(err or out).strip()}"
        )


def write(module, change, params):
    """Replace (or remove) one file: temp file, checks, validate, atomic rename."""
    backup = None
    if params["backup"] and change.before is not None:
        backup = backup_file(change.path, schedfiles.under_root(params["host_root"],
                                                                params["backup_dir"]))
    if change.after is None:
        os.unlink(change.path)
        return backup
    directory = os.path.dirname(change.path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    # A dot-name: the kubelet ignores hidden files in the manifests directory.
    handle, tmp = tempfile.mkstemp(prefix=".gpuk8s-", suffix=".yaml", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(change.after)
        if change.before is None:
            os.chmod(tmp, 0o644 if change.kind == "config" else 0o600)
        if params["validate"]:
            run_validate(module, params["validate"], tmp)
        module.atomic_move(tmp, change.path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return backup


def diff_of(plan):
    return [
        dict(
            before=change.before or "",
            after=change.after or "",
            before_header=change.path if change.before is not None else "(absent)",
            after_header=change.path if change.after is not None else "(absent)",
        )
        for change in plan.files
        if change.changed
    ]


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        supports_check_mode=True,
    )
    if schedfiles.RUAMEL_IMPORT_ERROR is not None:
        module.fail_json(
            msg=missing_required_lib("ruamel.yaml"), exception=schedfiles.RUAMEL_IMPORT_ERROR
        )
    params = module.params
    backups = []
    try:
        plan = schedfiles.plan(request_from_params(params, module.check_mode))
        if plan.changed and not module.check_mode:
            # present: the configuration first, since the patched manifest mounts it with
            # type File; absent: the manifest first, so no scheduler restarts without it.
            first = "config" if params["state"] == "present" else "manifest"
            for change in sorted(plan.files, key=lambda c: c.kind != first):
                if change.changed:
                    backup = write(module, change, params)
                    if backup:
                        backups.append(backup)
    except GpuK8sError as err:
        module.fail_json(msg=str(err), backup_files=backups)
    except OSError as err:
        module.fail_json(msg=f"cannot write {err.filename}: {err.strerror}", backup_files=backups)
    for warning in plan.warnings:
        module.warn(warning)
    result = dict(
        changed=plan.changed,
        state=params["state"],
        mode=plan.mode,
        api_version=plan.api_version,
        manifest_path=params["manifest_path"],
        config_path=plan.config_path,
        changes=plan.changes,
        files=[c.path for c in plan.files if c.changed],
        manifest_changed=any(c.changed and c.kind == "manifest" for c in plan.files),
        backup_files=backups,
    )
    if module._diff:
        result["diff"] = diff_of(plan)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
