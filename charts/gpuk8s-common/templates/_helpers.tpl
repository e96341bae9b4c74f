{{/*
Helpers shared by metax-gpu-extensions and metax-operator.

Most helpers take a context dict:
  root       the chart's root context ($)
  component  the component name, which is also the image name and the name of its
             namespaced objects (gpu-device, gpu-label, gpu-aware, driver-manager, ...)
  values     the component's values block (.Values.gpuDevice, .Values.driver, ...)
*/}}

{{/* helm.sh/chart label value. */}}
{{- define "gpuk8s.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of a cluster-scoped object of a component: <release>-<component>, at most 63. */}}
{{- define "gpuk8s.clusterName" -}}
{{- printf "%s-%s" .root.Release.Name .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades, so never add the version here. */}}
{{- define "gpuk8s.selectorLabels" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* Standard labels of every object. */}}
{{- define "gpuk8s.labels" -}}
{{ include "gpuk8s.selectorLabels" . }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: {{ .root.Chart.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | default .root.Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "gpuk8s.chart" .root }}
{{- end -}}

{{/*
Image of a component: <registry>/<component>:<tag>. The tag is the component's
imageTag, else the global imageTag, else the chart's appVersion.
Context: root, component, values (may lack imageTag).
*/}}
{{- define "gpuk8s.image" -}}
{{- $v := .values | default dict -}}
{{- $tag := $v.imageTag | default .root.Values.imageTag | default .root.Chart.AppVersion | toString -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .root.Values.registry) .component $tag -}}
{{- end -}}

{{/*
Effective log options of a component as YAML: every key of the component's own `log`
that is set wins over the global `log` (key by key; an explicit "" counts as set, so
`gpuLabel.log.dir=""` turns file logging off for gpu-label alone).
Context: root, values.
*/}}
{{- define "gpuk8s.log" -}}
{{- $global := .root.Values.log | default dict -}}
{{- $own := (.values | default dict).log | default dict -}}
{{- range $key := list "dir" "level" "format" "rotationTime" "maxAge" }}
{{ $key }}: {{ ternary (get $own $key) (get $global $key) (hasKey $own $key) | toString | quote }}
{{- end }}
{{- end -}}

{{/* Command-line flags of the effective log options (see gpuk8s.services.logging_setup). */}}
{{- define "gpuk8s.logArgs" -}}
{{- $log := include "gpuk8s.log" . | fromYaml -}}
- --log-dir={{ $log.dir }}
- --log-level={{ $log.level }}
- --log-format={{ $log.format }}
- --log-rotation-time={{ $log.rotationTime }}
- --log-max-age={{ $log.maxAge }}
{{- end -}}

{{/* True ("true") when the component writes log files on the host (log.dir not empty). */}}
{{- define "gpuk8s.logsToHost" -}}
{{- $log := include "gpuk8s.log" . | fromYaml -}}
{{- if $log.dir }}true{{ end -}}
{{- end -}}

{{/* volumeMounts entry for the host log directory, or nothing. Optional: volumeName. */}}
{{- define "gpuk8s.logVolumeMount" -}}
{{- $log := include "gpuk8s.log" . | fromYaml -}}
{{- if $log.dir }}
- name: {{ .volumeName | default "log" }}
  mountPath: {{ $log.dir }}
{{- end }}
{{- end -}}

{{/* volumes entry for the host log directory, or nothing. Optional: volumeName. */}}
{{- define "gpuk8s.logVolume" -}}
{{- $log := include "gpuk8s.log" . | fromYaml -}}
{{- if $log.dir }}
- name: {{ .volumeName | default "log" }}
  hostPath:
    path: {{ $log.dir }}
    type: DirectoryOrCreate
{{- end }}
{{- end -}}

{{/* imagePullSecrets of every pod. Context: root. */}}
{{- define "gpuk8s.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
Tolerations of the node agents: GPU nodes are often tainted with the resource name, and
small clusters put GPUs on control-plane nodes. Extra ones come from `tolerations`.
Context: root.
*/}}
{{- define "gpuk8s.nodeAgentTolerations" -}}
- key: CriticalAddonsOnly
  operator: Exists
- key: metax-tech.com/gpu
  operator: Exists
  effect: NoSchedule
- key: node-role.kubernetes.io/control-plane
  operator: Exists
  effect: NoSchedule
- key: node-role.kubernetes.io/master
  operator: Exists
  effect: NoSchedule
{{- with .Values.tolerations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Tolerations of the cluster-level Deployments (gpu-aware, operator-controller). */}}
{{- define "gpuk8s.controlPlaneTolerations" -}}
- key: CriticalAddonsOnly
  operator: Exists
- key: node-role.kubernetes.io/control-plane
  operator: Exists
  effect: NoSchedule
- key: node-role.kubernetes.io/master
  operator: Exists
  effect: NoSchedule
{{- with .Values.tolerations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Prefer control-plane nodes, but do not require them, so single-node labs work. */}}
{{- define "gpuk8s.preferControlPlane" -}}
nodeAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      preference:
        matchExpressions:
          - key: node-role.kubernetes.io/control-plane
            operator: Exists
{{- end -}}

{{/*
Node affinity requiring every label of .requiredLabels (a dict label -> value) plus
Linux. Context: requiredLabels.
*/}}
{{- define "gpuk8s.requireLabels" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: kubernetes.io/os
            operator: In
            values: ["linux"]
{{- range $key, $value := .requiredLabels }}
          - key: {{ $key }}
            operator: In
            values: [{{ $value | quote }}]
{{- end }}
{{- end -}}

{{/* Pod-level security context shared by every pod. */}}
{{- define "gpuk8s.podSecurityContext" -}}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
Container security context of a component that needs no privilege at all: no
capabilities, no escalation, read-only root filesystem. Context: uid (0 or 65532).
uid 0 is used only so the process owns the files it writes in root-owned host
directories (the log dir, the host root it reads); with every capability dropped, root
in the container cannot bypass file permissions nor touch anything else of the host.
*/}}
{{- define "gpuk8s.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
runAsNonRoot: {{ ne (int .uid) 0 }}
{{- end -}}

{{/*
uid of a Deployment that touches the host only through its log dir: root while it writes
log files there (the hostPath directory is root-owned), the image's non-root user otherwise.
Context: root, values.
*/}}
{{- define "gpuk8s.deploymentUid" -}}
{{- if include "gpuk8s.logsToHost" . }}0{{ else }}65532{{ end -}}
{{- end -}}

{{/* Resources block of a component, when set. Context: values. */}}
{{- define "gpuk8s.resources" -}}
{{- with (.values | default dict).resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* NODE_NAME from the downward API: node agents act on their own node only. */}}
{{- define "gpuk8s.nodeNameEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{/* A host path under hostPaths.root (the lab points it at a simulated host tree).
Context: root, path (absolute). */}}
{{- define "gpuk8s.hostPath" -}}
{{- $base := trimSuffix "/" .root.Values.hostPaths.root -}}
{{- printf "%s%s" $base .path -}}
{{- end -}}
