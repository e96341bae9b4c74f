{{/*
gpu-mps: one NVIDIA MPS control daemon per GPU (`gpuk8s serve mps`), only on nodes the
admin labelled gpuk8s.io/sharing-mode=mps: elsewhere the DaemonSet has no pod. When the
label changes away, the pod is stopped and quits its daemons first (echo quit |
nvidia-cuda-mps-control). The per-GPU pipe and log directories live in the host directory
/run/gpuk8s/mps (at the same path in the pod; the contract with gpu-device, which mounts
a GPU's pipe directory into its MPS clients).
Runs the gpu-device image at gpuDevice's tag (the same gpuk8s wheel, root). Context: root.
*/}}
{{- define "gpuk8s.gpuMps" -}}
{{- $root := .root -}}
{{- $v := $root.Values.gpuMps -}}
{{- $mpsDir := "/run/gpuk8s/mps" -}}
{{- $ctx := dict "root" $root "component" "gpu-mps" "values" $v -}}
{{- $image := dict "root" $root "component" "gpu-device" "values" $root.Values.gpuDevice -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpu-mps
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
automountServiceAccountToken: true
---
# gpu-mps reads its node's sharing-mode label: nothing else.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ include "gpuk8s.clusterName" $ctx }}
subjects:
  - kind: ServiceAccount
    name: gpu-mps
    namespace: {{ $root.Release.Namespace }}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: gpu-mps
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "gpuk8s.selectorLabels" $ctx | nindent 6 }}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        {{- include "gpuk8s.labels" $ctx | nindent 8 }}
    spec:
      serviceAccountName: gpu-mps
      priorityClassName: system-node-critical
      {{- with include "gpuk8s.imagePullSecrets" $root | trim }}{{ . | nindent 6 }}{{ end }}
      {{- include "gpuk8s.nodeAgentPlacement" (dict "root" $root "affinity" (dict "requiredLabels" (dict "gpuk8s.io/sharing-mode" "mps"))) | trim | nindent 6 }}
      tolerations:
        {{- include "gpuk8s.nodeAgentTolerations" $root | nindent 8 }}
      securityContext:
        {{- include "gpuk8s.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: gpu-mps
          image: {{ include "gpuk8s.image" $image | quote }}
          imagePullPolicy: {{ $root.Values.pullPolicy | quote }}
          command: ["gpuk8s"]
          args:
            - serve
            - mps
            - --host-root=/host
            - {{ printf "--mps-dir=%s" $mpsDir | quote }}
            - {{ printf "--interval=%v" $v.interval | quote }}
            {{- if $v.activeThreadPercentage }}
            - {{ printf "--active-thread-percentage=%v" $v.activeThreadPercentage | quote }}
            {{- end }}
            - --health-port=8083
            {{- range $v.extraArgs }}
            - {{ . | quote }}
            {{- end }}
            {{- include "gpuk8s.logArgs" $ctx | nindent 12 }}
          env:
            {{- include "gpuk8s.nodeNameEnv" $root | nindent 12 }}
          ports:
            - name: health
              containerPort: 8083
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: health
            initialDelaySeconds: 30
            periodSeconds: 30
            timeoutSeconds: 5
          # ready once every GPU of the node has its daemon
          readinessProbe:
            httpGet:
              path: /readyz
              port: health
            periodSeconds: 10
            timeoutSeconds: 5
          # Privileged: the MPS control daemon and the server it spawns open the GPUs'
          # device nodes, which the device cgroup denies to a container allocated none.
          securityContext:
            privileged: true
            readOnlyRootFilesystem: true
          {{- with include "gpuk8s.resources" $ctx | trim }}{{ . | nindent 10 }}{{ end }}
          volumeMounts:
            {{- include "gpuk8s.hostReadMounts" $root | trim | nindent 12 }}
            - name: mps-dir
              mountPath: {{ $mpsDir | quote }}
            {{- with include "gpuk8s.logVolumeMount" $ctx | trim }}{{ . | nindent 12 }}{{ end }}
      volumes:
        {{- include "gpuk8s.hostReadVolumes" $root | trim | nindent 8 }}
        - name: mps-dir
          hostPath:
            path: {{ $mpsDir | quote }}
            type: DirectoryOrCreate
        {{- with include "gpuk8s.logVolume" $ctx | trim }}{{ . | nindent 8 }}{{ end }}
{{- end -}}
