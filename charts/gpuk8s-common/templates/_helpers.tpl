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
An image reference given by the user (a payload image): <registry>/<ref>, unless ref
already names a registry, then ref as it is. As in Docker's reference grammar, the first
path component names a registry when it holds a "." or a ":" or is "localhost"
(cr.metax-tech.com/cloud/maca-c500:2.18, localhost:5000/x:1; not maca-c500:2.18).
Context: registry, ref.
*/}}
{{- define "gpuk8s.imageRef" -}}
{{- $first := splitList "/" .ref | first -}}
{{- if and (contains "/" .ref) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- .ref -}}
{{- else -}}
{{- printf "%s/%s" (trimSuffix "/" .registry) .ref -}}
{{- end -}}
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

{{/* Command-line flags of the effective log options (see gpuk8s.services.logging_setup).
Quoted: a value is data, never YAML (`log.dir='/var/log/a #b'` stays whole). */}}
{{- define "gpuk8s.logArgs" -}}
{{- $log := include "gpuk8s.log" . | fromYaml -}}
- {{ printf "--log-dir=%s" $log.dir | quote }}
- {{ printf "--log-level=%s" $log.level | quote }}
- {{ printf "--log-format=%s" $log.format | quote }}
- {{ printf "--log-rotation-time=%s" $log.rotationTime | quote }}
- {{ printf "--log-max-age=%s" $log.maxAge | quote }}
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
  mountPath: {{ $log.dir | quote }}
{{- end }}
{{- end -}}

{{/* volumes entry for the host log directory, or nothing. Optional: volumeName. */}}
{{- define "gpuk8s.logVolume" -}}
{{- $log := include "gpuk8s.log" . | fromYaml -}}
{{- if $log.dir }}
- name: {{ .volumeName | default "log" }}
  hostPath:
    path: {{ $log.dir | quote }}
    type: DirectoryOrCreate
{{- end }}
{{- end -}}

{{/* imagePullSecrets of every pod. Context: root. */}}
{{- define "gpuk8s.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . | quote }}
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
{{- range $key, $value := .excludedLabels }}
          - key: {{ $key }}
            operator: NotIn
            values: [{{ $value | quote }}]
{{- end }}
{{- end -}}

{{/*
Where a node agent DaemonSet's pods run: nodeSelector (kubernetes.io/os=linux plus the
release's .Values.nodeSelector) and affinity (the agent's own required labels, each
term of the release's .Values.affinity required nodeSelectorTerms ANDed with them; its
preferred terms, podAffinity and podAntiAffinity as given). With both values empty the
output is the agent's own placement, unchanged. Context: root, and affinity (the
gpuk8s.requireLabels context of an agent that requires labels; absent: the agent runs on
every Linux node).
*/}}
{{- define "gpuk8s.nodeAgentPlacement" -}}
{{- $sel := .root.Values.nodeSelector | default dict -}}
{{- $aff := .root.Values.affinity | default dict -}}
{{- if or (not .affinity) $sel }}
nodeSelector:
  {{- toYaml (merge (dict "kubernetes.io/os" "linux") $sel) | nindent 2 }}
{{- end }}
{{- if and .affinity (not $aff) }}
affinity:
  {{- include "gpuk8s.requireLabels" .affinity | nindent 2 }}
{{- else if .affinity }}
{{- $ours := include "gpuk8s.requireLabels" .affinity | fromYaml -}}
{{- $exprs := (first $ours.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms).matchExpressions -}}
{{- $na := $aff.nodeAffinity | default dict -}}
{{- $req := $na.requiredDuringSchedulingIgnoredDuringExecution | default dict -}}
{{- $terms := list -}}
{{- range $req.nodeSelectorTerms | default (list dict) -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (concat $exprs (.matchExpressions | default list)) -}}
{{- $terms = append $terms $term -}}
{{- end -}}
{{- $outNa := merge (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms)) (omit $na "requiredDuringSchedulingIgnoredDuringExecution") }}
affinity:
  {{- toYaml (merge (dict "nodeAffinity" $outNa) (omit $aff "nodeAffinity")) | nindent 2 }}
{{- else if $aff }}
affinity:
  {{- toYaml $aff | nindent 2 }}
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
uid of a Deployment that touches the host only through its log dir: always the image's
non-root user; gpuk8s.logDirInit makes the host log dir writable for it.
Context: root, values.
*/}}
{{- define "gpuk8s.deploymentUid" -}}
65532
{{- end -}}

{{/*
initContainers entry (or nothing) that lets uid/gid 65532 write the host log dir: the
directory gets group 65532 and mode 3775 (group-writable; setgid so new files keep the
group; sticky, so no component can remove another's files) and this component's own
log files (<component>.log*, possibly written as root by an older release) become
65532's. It runs as root with only CHOWN and FOWNER. Context: root, component, values.
*/}}
{{- define "gpuk8s.logDirInit" -}}
{{- $log := include "gpuk8s.log" . | fromYaml -}}
{{- if $log.dir }}
- name: log-dir
  image: {{ include "gpuk8s.image" . | quote }}
  imagePullPolicy: {{ .root.Values.pullPolicy | quote }}
  command: ["python3", "-c"]
  args:
    - |
      import os, sys
      d, prefix = sys.argv[1], sys.argv[2] + ".log"
      os.chown(d, -1, 65532)
      os.chmod(d, 0o3775)
      for name in os.listdir(d):
          if name.startswith(prefix):
              os.chown(os.path.join(d, name), 65532, 65532)
    - /log
    - {{ .component | quote }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    runAsUser: 0
    runAsNonRoot: false
    capabilities:
      drop: ["ALL"]
      add: ["CHOWN", "FOWNER"]
  volumeMounts:
    - name: {{ .volumeName | default "log" }}
      mountPath: /log
{{- end }}
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
{{- printf "%s%s" $base .path | quote -}}
{{- end -}}

{{/*
What the node agents read of the host, instead of the whole host /: each path is mounted
read-only at /host<path> (the agents run with --host-root=/host). Discovery needs sysfs
(PCI devices, the driver module), /dev (device nodes), /opt (the driver's and SDK's
Version.txt, mx-smi, vendor libraries), the usual places of mx-smi and nvidia-smi,
/proc/driver (NVIDIA's per-GPU files), /run/metax (the operator's readiness files) and
/var/lib/gpuk8s (driver-owner.json: gpu.driver.mode=cloud while driver-manager's driver runs).
Each line: volume name, path, hostPath type; /sys, /dev, /opt and /run/metax follow the
host's later mounts (hot-plug, a driver installed by driver-manager). hostPaths.extraReadPaths
adds more (a vendor tool's own files; the lab's simulated mx-smi keeps its state in
/var/lib/gpuk8s-sim).
*/}}
{{- define "gpuk8s.hostReadPaths" -}}
host-sys /sys Directory
host-dev /dev Directory
host-opt /opt DirectoryOrCreate
host-usr-bin /usr/bin DirectoryOrCreate
host-usr-local-bin /usr/local/bin DirectoryOrCreate
host-proc-driver /proc/driver DirectoryOrCreate
host-run-metax /run/metax DirectoryOrCreate
host-var-lib-gpuk8s /var/lib/gpuk8s DirectoryOrCreate
{{- range $i, $path := .Values.hostPaths.extraReadPaths | default list }}
host-extra-{{ $i }} {{ $path }} Directory
{{- end }}
{{- end -}}

{{/* volumeMounts of gpuk8s.hostReadPaths. Context: root. */}}
{{- define "gpuk8s.hostReadMounts" -}}
{{- range $line := splitList "\n" (include "gpuk8s.hostReadPaths" .) }}
{{- $f := splitList " " $line }}
- name: {{ index $f 0 }}
  mountPath: {{ printf "/host%s" (index $f 1) | quote }}
  readOnly: true
  {{- if has (index $f 1) (list "/sys" "/dev" "/opt" "/run/metax") }}
  mountPropagation: HostToContainer
  {{- end }}
{{- end }}
{{- end -}}

{{/* volumes of gpuk8s.hostReadPaths, under hostPaths.root. Context: root. */}}
{{- define "gpuk8s.hostReadVolumes" -}}
{{- $root := . -}}
{{- range $line := splitList "\n" (include "gpuk8s.hostReadPaths" .) }}
{{- $f := splitList " " $line }}
- name: {{ index $f 0 }}
  hostPath:
    path: {{ include "gpuk8s.hostPath" (dict "root" $root "path" (index $f 1)) }}
    type: {{ index $f 2 }}
{{- end }}
{{- end -}}


{{/*
The release's nodeSelector as a label selector (key=value,... sorted by key; empty: every
node): the uninstall hooks (and operator-controller) act on those nodes only, so a release confined
to a node group (another scheme's release beside it) leaves the other nodes alone.
*/}}
{{- define "gpuk8s.nodeSelectorTerms" -}}
{{- $terms := list -}}
{{- range $key, $value := .Values.nodeSelector | default dict -}}
{{- $terms = append $terms (printf "%s=%s" $key (toString $value)) -}}
{{- end -}}
{{- join "," $terms -}}
{{- end -}}
