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
