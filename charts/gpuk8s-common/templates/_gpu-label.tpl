{{/*
gpu-label: the node labeller DaemonSet and its RBAC.
It runs on every Linux node, with no selector on metax-tech.com/ labels: it is the
component that writes them (gpu.installed=false included), so it cannot wait for them.
Context: root.
*/}}
{{- define "gpuk8s.gpuLabel" -}}
{{- $root := .root -}}
{{- $ctx := dict "root" $root "component" "gpu-label" "values" $root.Values.gpuLabel -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpu-label
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
automountServiceAccountToken: true
---
# The labeller reads its node and patches its labels: nothing else.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get", "patch"]
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
    name: gpu-label
    namespace: {{ $root.Release.Namespace }}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: gpu-label
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
      serviceAccountName: gpu-label
      priorityClassName: system-node-critical
      {{- with include "gpuk8s.imagePullSecrets" $root | trim }}{{ . | nindent 6 }}{{ end }}
      {{- include "gpuk8s.nodeAgentPlacement" (dict "root" $root) | trim | nindent 6 }}
      tolerations:
        {{- include "gpuk8s.nodeAgentTolerations" $root | nindent 8 }}
      securityContext:
        {{- include "gpuk8s.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: gpu-label
          image: {{ include "gpuk8s.image" $ctx | quote }}
          imagePullPolicy: {{ $root.Values.pullPolicy | quote }}
          command: ["gpuk8s"]
          args:
            - serve
            - labeller
            - --host-root=/host
            - {{ printf "--interval=%v" $root.Values.gpuLabel.interval | quote }}
            - --health-port=8081
            {{- if and $root.Values.gpuDevice $root.Values.gpuDevice.sharing }}
            # GFD's sharing labels follow the mode gpu-device serves (the node's label)
            - --sharing
            {{- end }}
            {{- range $root.Values.gpuLabel.extraArgs }}
            - {{ . | quote }}
            {{- end }}
            {{- include "gpuk8s.logArgs" $ctx | nindent 12 }}
          env:
            {{- include "gpuk8s.nodeNameEnv" $root | nindent 12 }}
          ports:
            - name: health
              containerPort: 8081
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: health
            initialDelaySeconds: 30
            periodSeconds: 30
            timeoutSeconds: 5
          # ready once a label pass has succeeded
          readinessProbe:
            httpGet:
              path: /readyz
              port: health
            periodSeconds: 10
            timeoutSeconds: 5
          # Not privileged: it only reads the host (sysfs, /opt/maca, the driver's version
          # files) through read-only mounts of those paths. uid 0 because some of those
          # files are root-only (sysfs config space, driver files); every capability is dropped.
          securityContext:
            {{- include "gpuk8s.restrictedSecurityContext" (dict "uid" 0) | nindent 12 }}
          {{- with include "gpuk8s.resources" $ctx | trim }}{{ . | nindent 10 }}{{ end }}
          volumeMounts:
            {{- include "gpuk8s.hostReadMounts" $root | trim | nindent 12 }}
            {{- with include "gpuk8s.logVolumeMount" $ctx | trim }}{{ . | nindent 12 }}{{ end }}
      volumes:
        {{- include "gpuk8s.hostReadVolumes" $root | trim | nindent 8 }}
        {{- with include "gpuk8s.logVolume" $ctx | trim }}{{ . | nindent 8 }}{{ end }}
{{- end -}}
