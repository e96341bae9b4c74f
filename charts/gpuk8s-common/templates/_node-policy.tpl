{{/*
The Node keys each node agent owns: the labels and annotations it writes on its own Node
(and may remove), and nothing else of the Node. The one list: tests/unit/test_charts.py
checks it against the Python constants the agents write with.
  gpu-label          its labels (services/labeller): every label under metax-tech.com/
                     (core.labels.PREFIX) except operator-controller's driver.upgrade-state
                     (core.labels.FOREIGN_LABELS), GFD's nvidia.com/ labels
                     (core.labels.GFD_LABELS) and the manual's bare cuda-*-version
                     (core.cuda.BARE_LABELS)
  gpu-device         its annotations (deviceplugin.nodestate): the device list and the
                     topology score and loss tables
  driver-manager     its state annotations (nodeagent.state_annotation of
  container-runtime  driver-manager.driver, driver-manager.maca, container-runtime)
Fields: labels / annotations (exact keys), labelPrefixes / annotationPrefixes, and
labelExcept / annotationExcept (keys under a prefix that are not the agent's).
*/}}
{{- define "gpuk8s.nodeAgentKeys" -}}
gpu-label:
  labelPrefixes: [metax-tech.com/]
  labelExcept: [metax-tech.com/driver.upgrade-state]
  labels:
    - cuda-major-version
    - cuda-minor-version
    - nvidia.com/gpu.product
    - nvidia.com/gpu.memory
    - nvidia.com/gpu.count
    - nvidia.com/gpu.family
    - nvidia.com/gpu.compute.major
    - nvidia.com/gpu.compute.minor
    - nvidia.com/cuda.driver.major
    - nvidia.com/cuda.driver.minor
    - nvidia.com/cuda.driver.rev
    - nvidia.com/cuda.runtime.major
    - nvidia.com/cuda.runtime.minor
    - nvidia.com/cuda.driver-version.major
    - nvidia.com/cuda.driver-version.minor
    - nvidia.com/cuda.driver-version.revision
    - nvidia.com/cuda.driver-version.full
    - nvidia.com/cuda.runtime-version.major
    - nvidia.com/cuda.runtime-version.minor
    - nvidia.com/cuda.runtime-version.full
    - nvidia.com/gpu.replicas
    - nvidia.com/gpu.sharing-strategy
    - nvidia.com/mps.capable
    - nvidia.com/mig.capable
    - nvidia.com/mig.strategy
    - nvidia.com/gpu.machine
    - nvidia.com/gpu.present
    - nvidia.com/gpu.mode
gpu-device:
  annotations:
    - metax-tech.com/gpu.devices
    - metax-tech.com/gpu.topology.scores
    - metax-tech.com/gpu.topology.losses
driver-manager:
  annotations:
    - metax-tech.com/driver-manager.driver.state
    - metax-tech.com/driver-manager.maca.state
container-runtime:
  annotations:
    - metax-tech.com/container-runtime.state
{{- end -}}


{{/*
Kubernetes RBAC cannot say "only your own Node" or "only these keys": the node agents'
ClusterRoles allow `patch` on every Node. Where the cluster serves
ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, Kubernetes >= 1.30) this
policy closes the gap, as NodeRestriction does for the kubelet: a request from one of these
ServiceAccounts that changes a Node is denied unless the Node is the one its pod runs on,
and unless it only adds, changes or removes the labels and annotations the agent owns
(gpuk8s.nodeAgentKeys): no other label or annotation (node-role.kubernetes.io/...,
kubernetes.io/hostname, another agent's), no spec (taints, unschedulable), no finalizers
or owners, no status, no delete. The node comes from the token (pod-bound ServiceAccount
tokens carry authentication.kubernetes.io/node-name since 1.30); a token without it (a
legacy Secret token) cannot change any Node.
Context: root, serviceAccounts (names in the release namespace, each in gpuk8s.nodeAgentKeys).
*/}}
{{- define "gpuk8s.ownNodePolicy" -}}
{{- $root := .root -}}
{{- if $root.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- $ctx := dict "root" $root "component" "own-node" -}}
{{- $keys := include "gpuk8s.nodeAgentKeys" $root | fromYaml -}}
{{- $users := list -}}
{{- $owned := dict -}}
{{- range .serviceAccounts }}
{{- $user := printf "system:serviceaccount:%s:%s" $root.Release.Namespace . -}}
{{- $users = append $users $user -}}
{{- if not (hasKey $keys .) }}
{{- fail (printf "gpuk8s.ownNodePolicy: %s owns no Node keys in gpuk8s.nodeAgentKeys (known: %s)" . (keys $keys | sortAlpha | join ", ")) }}
{{- end }}
{{- $mine := get $keys . -}}
{{- $entry := dict -}}
{{- range $field := list "labels" "labelPrefixes" "labelExcept" "annotations" "annotationPrefixes" "annotationExcept" }}
{{- $_ := set $entry $field (get $mine $field | default list) -}}
{{- end }}
{{- $_ := set $owned $user $entry -}}
{{- end }}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["UPDATE", "DELETE"]
        resources: ["nodes", "nodes/status"]
  matchConditions:
    - name: gpuk8s-node-agent
      expression: {{ printf "request.userInfo.username in %s" ($users | toJson) | quote }}
  variables:
    - name: owned
      expression: {{ printf "%s[request.userInfo.username]" ($owned | toJson) | quote }}
    - name: oldLabels
      expression: "oldObject == null ? {} : oldObject.metadata.?labels.orValue({})"
    - name: newLabels
      expression: "object == null ? {} : object.metadata.?labels.orValue({})"
    - name: oldAnnotations
      expression: "oldObject == null ? {} : oldObject.metadata.?annotations.orValue({})"
    - name: newAnnotations
      expression: "object == null ? {} : object.metadata.?annotations.orValue({})"
    - name: foreignLabels
      expression: >-
        (variables.newLabels.filter(k, !(k in variables.oldLabels) ||
        variables.oldLabels[k] != variables.newLabels[k]) +
        variables.oldLabels.filter(k, !(k in variables.newLabels))).filter(k,
        !((k in variables.owned.labels || variables.owned.labelPrefixes.exists(p, k.startsWith(p))) &&
        !(k in variables.owned.labelExcept)))
    - name: foreignAnnotations
      expression: >-
        (variables.newAnnotations.filter(k, !(k in variables.oldAnnotations) ||
        variables.oldAnnotations[k] != variables.newAnnotations[k]) +
        variables.oldAnnotations.filter(k, !(k in variables.newAnnotations))).filter(k,
        !((k in variables.owned.annotations ||
        variables.owned.annotationPrefixes.exists(p, k.startsWith(p))) &&
        !(k in variables.owned.annotationExcept)))
  validations:
    - expression: >-
        has(request.userInfo.extra) &&
        'authentication.kubernetes.io/node-name' in request.userInfo.extra &&
        request.userInfo.extra['authentication.kubernetes.io/node-name'] == [oldObject.metadata.name]
      messageExpression: >-
        request.userInfo.username + ' may change only the Node its pod runs on, not ' +
        oldObject.metadata.name
      reason: Forbidden
    - expression: "request.operation == 'UPDATE' && request.?subResource.orValue('') == ''"
      messageExpression: >-
        request.userInfo.username + ' may only patch its Node\'s labels and annotations, not ' +
        (request.operation == 'DELETE' ? 'delete the Node' : 'change its status')
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE' || (
        object.?spec.orValue({}) == oldObject.?spec.orValue({}) &&
        object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&
        object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]))
      messageExpression: >-
        request.userInfo.username + ' may not change the Node\'s spec (taints, unschedulable, ...),
        finalizers or owners'
      reason: Forbidden
    - expression: "variables.foreignLabels.size() == 0"
      messageExpression: >-
        request.userInfo.username + ' may not change the Node labels ' +
        variables.foreignLabels.join(', ') + ': not its own (it owns ' +
        (variables.owned.labels + variables.owned.labelPrefixes.map(p, p + '*')).join(', ') + ')'
      reason: Forbidden
    - expression: "variables.foreignAnnotations.size() == 0"
      messageExpression: >-
        request.userInfo.username + ' may not change the Node annotations ' +
        variables.foreignAnnotations.join(', ') + ': not its own (it owns ' +
        (variables.owned.annotations + variables.owned.annotationPrefixes.map(p, p + '*')).join(', ') + ')'
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  policyName: {{ include "gpuk8s.clusterName" $ctx }}
  validationActions: [Deny]
{{- end }}
{{- end -}}


{{/*
The same gap for Pods: with GPU sharing gpu-device's ClusterRole allows `patch` on every
Pod, which RBAC cannot narrow to a node or a field. This policy (NodeRestriction's rule
for the kubelet, kept by the API server) lets gpu-device change a Pod only when the Pod is
bound to the node its own pod runs on (from its pod-bound token), and only by setting the
one annotation it owns, gpuk8s.io/sharing.phase, to "allocated"
(services/deviceplugin/sharing.py): its spec, labels, finalizers, owners and every other
annotation stay as they were. A compromised GPU node cannot run its code in another pod.
Context: root.
*/}}
{{- define "gpuk8s.ownNodePodPolicy" -}}
{{- $root := .root -}}
{{- if $root.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- $ctx := dict "root" $root "component" "own-node-pods" -}}
{{- $owned := "gpuk8s.io/sharing.phase" }}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["pods", "pods/*"]
  matchConditions:
    - name: gpu-device
      expression: {{ printf "request.userInfo.username == %q" (printf "system:serviceaccount:%s:gpu-device" $root.Release.Namespace) | quote }}
  variables:
    - name: node
      expression: >-
        has(request.userInfo.extra) &&
        'authentication.kubernetes.io/node-name' in request.userInfo.extra ?
        request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''
    - name: oldAnnotations
      expression: "oldObject == null ? {} : oldObject.metadata.?annotations.orValue({})"
    - name: newAnnotations
      expression: "object == null ? {} : object.metadata.?annotations.orValue({})"
  validations:
    - expression: >-
        request.operation == 'UPDATE' && request.?subResource.orValue('') == '' && variables.node != '' &&
        oldObject.spec.?nodeName.orValue('') == variables.node
      messageExpression: >-
        request.userInfo.username + ' may change only Pods bound to the node its pod runs on (' +
        variables.node + ')' + (request.operation == 'UPDATE' && request.?subResource.orValue('') == '' ?
        ', not a Pod on ' + oldObject.spec.?nodeName.orValue('no node') : ', and only by patching them')
      reason: Forbidden
    - expression: >-
        request.operation != 'UPDATE' || request.?subResource.orValue('') != '' || (
        object.spec == oldObject.spec &&
        object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({}) &&
        object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&
        object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]) &&
        variables.newAnnotations.all(k, k == {{ $owned | quote }} ||
          (k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.newAnnotations[k])) &&
        variables.oldAnnotations.all(k, k in variables.newAnnotations) &&
        (!({{ $owned | quote }} in variables.newAnnotations) ||
          variables.newAnnotations[{{ $owned | quote }}] == 'allocated' ||
          variables.newAnnotations[{{ $owned | quote }}] == variables.oldAnnotations[?{{ $owned | quote }}].orValue('')))
      message: >-
        gpu-device may set only the Pod annotation {{ $owned }} (to allocated); the Pod's
        spec, labels, finalizers, owners and other annotations are not its to change
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  policyName: {{ include "gpuk8s.clusterName" $ctx }}
  validationActions: [Deny]
{{- end }}
{{- end -}}


{{/*
Events about Nodes: a node agent may create an Event only about the Node its pod runs on
(its token's node), as the kubelet may; events of other nodes, and of other objects, are
not its to write. Context: root, serviceAccounts (names in the release namespace).
*/}}
{{- define "gpuk8s.ownNodeEventPolicy" -}}
{{- $root := .root -}}
{{- if $root.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- $ctx := dict "root" $root "component" "own-node-events" -}}
{{- $users := list -}}
{{- range .serviceAccounts }}
{{- $users = append $users (printf "system:serviceaccount:%s:%s" $root.Release.Namespace .) -}}
{{- end }}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["events"]
  matchConditions:
    - name: gpuk8s-node-agent
      expression: {{ printf "request.userInfo.username in %s" ($users | toJson) | quote }}
  validations:
    - expression: >-
        request.operation == 'CREATE' &&
        has(request.userInfo.extra) &&
        'authentication.kubernetes.io/node-name' in request.userInfo.extra &&
        object.involvedObject.?kind.orValue('') == 'Node' &&
        [object.involvedObject.?name.orValue('')] == request.userInfo.extra['authentication.kubernetes.io/node-name']
      messageExpression: >-
        request.userInfo.username + ' may create only Events about the Node its pod runs on'
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  policyName: {{ include "gpuk8s.clusterName" $ctx }}
  validationActions: [Deny]
{{- end }}
{{- end -}}
