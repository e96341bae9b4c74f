#!/usr/bin/python
# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: evict the pods that use GPUs on one node (SPEC §9 step 3)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_pod_eviction
short_description: Evict the pods that request GPUs from a node, respecting PodDisruptionBudgets
description:
  - Finds the pods on O(node) whose containers request a resource under
    O(resource_prefixes) (default C(metax-tech.com/)) and evicts them through the Eviction
    API, like C(kubectl drain) does for all pods. DaemonSet pods and static pods are left
    alone; finished pods are ignored.
  - As C(kubectl drain) does, a pod that declares no controller (nothing would recreate
    it) is evicted only with O(force), and a pod with an C(emptyDir) volume only with
    O(delete_emptydir_data); without them the task fails naming every such pod and
    nothing is evicted (in check mode too). A pod already being deleted is only waited for.
  - An eviction refused with HTTP 429 (a PodDisruptionBudget) is retried every
    O(retry_delay) seconds; a pod already gone (404) counts as done. The module then waits
    until every evicted pod is gone or replaced, all within O(timeout) seconds, and fails
    naming the pods still there.
  - Cordon the node first (the node_maintenance role does), or the pods may come back.
version_added: "0.1.0"
author:
  - gpuk8s contributors
options:
  node:
    description: Node name.
    type: str
    required: true
  resource_prefixes:
    description: A pod is a GPU pod when it requests a resource starting with one of these.
    type: list
    elements: str
    default: [metax-tech.com/]
  timeout:
    description: Seconds for evicting and waiting, together.
    type: int
    default: 300
  retry_delay:
    description: Seconds between two tries of an eviction refused with HTTP 429.
    type: int
    default: 5
  grace_period:
    description: Termination grace period in seconds; default the pod's own.
    type: int
  force:
    description:
      - Also evict GPU pods that declare no controller (C(kubectl drain --force)); they
        are not recreated anywhere.
    type: bool
    default: false
  delete_emptydir_data:
    description:
      - Also evict GPU pods with C(emptyDir) volumes, whose data is lost
        (C(kubectl drain --delete-emptydir-data)).
    type: bool
    default: false
  kubeconfig:
    description:
      - kubeconfig file; default the client's (C(KUBECONFIG), C(~/.kube/config), in-cluster).
    type: path
  context:
    description: kubeconfig context.
    type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
requirements:
  - kubernetes (Python client) on the host that runs the module
"""

EXAMPLES = r"""
- name: Stop the GPU pods on the node
  gpu_pod_eviction:
    node: gpu-node-1
    timeout: 600
  delegate_to: "{{ groups['kube_control_plane'][0] }}"

- name: Also bare pods and pods with scratch data (kubectl drain --force --delete-emptydir-data)
  gpu_pod_eviction:
    node: gpu-node-1
    force: true
    delete_emptydir_data: true
"""

RETURN = r"""
pods:
  description: GPU pods found on the node (namespace/name), all evicted unless in check mode.
  returned: always
  type: list
  elements: str
  sample: [ml/train-0]
forced:
  description: What C(kubectl drain) would warn about - pods evicted only because of O(force)
    or O(delete_emptydir_data) (also shown as task warnings).
  returned: always
  type: list
  elements: str
  sample: ["deleting Pods that declare no controller: ml/debug (force)"]
log:
  description: What happened, one line per event.
  returned: always
  type: list
  elements: str
  sample: [evicted ml/train-0]
"""

import json  # noqa: E402
import traceback  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible.module_utils.gpuk8s.ansible import eviction  # noqa: E402
from ansible.module_utils.gpuk8s.core.errors import GpuK8sError  # noqa: E402

try:
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    KUBERNETES_ERROR = None
except ImportError:
    KUBERNETES_ERROR = traceback.format_exc()


def api_message(err):
    """The Status message of an API error (its JSON body), else the reason."""
    try:
        return str(json.loads(err.body).get("message") or err.reason)[:300]
    except (TypeError, ValueError, AttributeError):
        return str(err.reason or err.body or "")[:300]


def core_api(params):
    try:
        config.load_kube_config(config_file=params["kubeconfig"], context=params["context"])
    except Exception:  # no kubeconfig: inside a pod, use the service account
        if params["kubeconfig"]:
            raise
        config.load_incluster_config()
    return client.CoreV1Api()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            node=dict(type="str", required=True),
            resource_prefixes=dict(type="list", elements="str", default=["metax-tech.com/"]),
            timeout=dict(type="int", default=300),
            retry_delay=dict(type="int", default=5),
            grace_period=dict(type="int"),
            force=dict(type="bool", default=False),
            delete_emptydir_data=dict(type="bool", default=False),
            kubeconfig=dict(type="path"),
            context=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    if KUBERNETES_ERROR:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_ERROR)
    params = module.params
    log = []
    pods = ()
    selection = None
    try:
        api = core_api(params)
        listed = api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={params['node']}")
        raw = api.api_client.sanitize_for_serialization(listed).get("items", [])
        selection = eviction.select(raw, params["resource_prefixes"], force=params["force"],
                                    delete_emptydir_data=params["delete_emptydir_data"])
        pods = selection.pods
        selection.check()
        if pods and not module.check_mode:

            def evict(pod):
                body = client.V1Eviction(
                    metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
                    delete_options=None if params["grace_period"] is None else
                    client.V1DeleteOptions(grace_period_seconds=params["grace_period"]),
                )
                try:
                    api.create_namespaced_pod_eviction(pod.name, pod.namespace, body)
                except ApiException as err:
                    return err.status, api_message(err)
                return 201, ""

            def current(pod):
                try:
                    return api.read_namespaced_pod(pod.name, pod.namespace).metadata.uid
                except ApiException as err:
                    if err.status == 404:
                        return None
                    raise

            log = eviction.evict_all(pods, evict, current, timeout=params["timeout"],
                                     retry_delay=params["retry_delay"])
    except GpuK8sError as err:
        module.fail_json(msg=str(err), log=log, pods=[str(p) for p in pods])
    except ApiException as err:
        module.fail_json(msg=f"Kubernetes API error {err.status}: {err.reason}", log=log)
    except Exception as err:  # kubeconfig problems surface as assorted exceptions
        module.fail_json(msg=f"cannot reach the Kubernetes API: {err}", log=log)
    warnings = list(selection.warnings) if selection else []
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=bool(pods), pods=[str(p) for p in pods], forced=warnings, log=log)


if __name__ == "__main__":
    main()
