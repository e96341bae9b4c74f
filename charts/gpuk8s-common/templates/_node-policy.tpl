{{/*
Kubernetes RBAC cannot say "only your own Node": the node agents' ClusterRoles allow
`patch` on every Node. Where the cluster serves ValidatingAdmissionPolicy
(admissionregistration.k8s.io/v1, Kubernetes >= 1.30) this policy closes the gap: a
request from one of these ServiceAccounts that changes a Node is denied unless the Node
is the one its pod runs on. The node comes from the token (pod-bound ServiceAccount
tokens carry authentication.kubernetes.io/node-name since 1.30); a token without it
(a legacy Secret token) cannot change any Node.
Context: root, serviceAccounts (names in the release namespace).
*/}}
{{- define "gpuk8s.ownNodePolicy" -}}
{{- $root := .root -}}
{{- if $root.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- $ctx := dict "root" $root "component" "own-node" -}}
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
        operations: ["UPDATE", "DELETE"]
        resources: ["nodes", "nodes/status"]
  matchConditions:
    - name: gpuk8s-node-agent
      expression: {{ printf "request.userInfo.username in %s" ($users | toJson) | quote }}
  validations:
    - expression: >-
        has(request.userInfo.extra) &&
        'authentication.kubernetes.io/node-name' in request.userInfo.extra &&
        request.userInfo.extra['authentication.kubernetes.io/node-name'] == [oldObject.metadata.name]
      messageExpression: >-
        request.userInfo.username + ' may change only the Node its pod runs on, not ' +
        oldObject.metadata.name
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
