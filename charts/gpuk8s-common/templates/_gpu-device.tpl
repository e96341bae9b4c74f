{{/*
gpu-device: the device plugin DaemonSet and its RBAC.
Context: root, schemeArgs (flags the scheme adds, e.g. --cdi), requiredLabels (node labels the DaemonSet waits for; the chart decides:
gpu.installed + driver.ready in the extensions scheme, plus the operator's readiness
labels in the operator scheme). Because gpu-device runs only where those labels are,
removing the metax-tech.com/ labels from a node (SPEC §9 maintenance) makes its pod leave.
*/}}
{{- define "gpuk8s.gpuDevice" -}}
{{- $root := .root -}}
{{- $ctx := dict "root" $root "component" "gpu-device" "values" $root.Values.gpuDevice -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpu-device
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
automountServiceAccountToken: true
---
# The device plugin reads its node and writes the topology annotations
# (metax-tech.com/gpu.topology.*) on it; with GPU sharing it also reads the pods of its
# node and marks them allocated (gpuk8s.io/sharing.phase): nothing else.
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
  {{- if $root.Values.gpuDevice.sharing }}
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["list", "patch"]
  {{- end }}
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
    name: gpu-device
    namespace: {{ $root.Release.Namespace }}
---
# Named metax-gpu-device (its pods metax-gpu-device-xxxxx) as the manual finds them; the
# component, its labels and its ServiceAccount stay gpu-device.
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: metax-gpu-device
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
      serviceAccountName: gpu-device
      priorityClassName: system-node-critical
      {{- with include "gpuk8s.imagePullSecrets" $root | trim }}{{ . | nindent 6 }}{{ end }}
      {{- /* a node labelled gpuk8s.io/allocation-mode=dra is gpu-dra's, never both */}}
      {{- include "gpuk8s.nodeAgentPlacement" (dict "root" $root "affinity" (merge (dict "excludedLabels" (dict (include "gpuk8s.draModeLabel" .) "dra")) .)) | trim | nindent 6 }}
      tolerations:
        {{- include "gpuk8s.nodeAgentTolerations" $root | nindent 8 }}
      securityContext:
        {{- include "gpuk8s.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: gpu-device
          image: {{ include "gpuk8s.image" $ctx | quote }}
          imagePullPolicy: {{ $root.Values.pullPolicy | quote }}
          command: ["gpuk8s"]
          args:
            - serve
            - device-plugin
            - --host-root=/host
            - {{ printf "--healthy-interval=%v" $root.Values.gpuDevice.healthyInterval | quote }}
            {{- with trimSuffix "/" $root.Values.hostPaths.root }}
            # the host tree is not the node's /: device paths handed to the kubelet live under it
            - {{ printf "--device-path-prefix=%s" . | quote }}
            {{- end }}
            {{- range .schemeArgs }}
            - {{ . | quote }}
            {{- end }}
            - --health-port=8082
            {{- if $root.Values.gpuDevice.sharing }}
            - --sharing-mode=auto
            {{- end }}
            {{- range $root.Values.gpuDevice.extraArgs }}
            - {{ . | quote }}
            {{- end }}
            {{- include "gpuk8s.logArgs" $ctx | nindent 12 }}
          env:
            {{- include "gpuk8s.nodeNameEnv" $root | nindent 12 }}
          ports:
            - name: health
              containerPort: 8082
              protocol: TCP
          # live: the gRPC server and the health loop run; ready: registered with the kubelet
          livenessProbe:
            httpGet:
              path: /healthz
              port: health
            initialDelaySeconds: 30
            periodSeconds: 30
            timeoutSeconds: 5
          readinessProbe:
            httpGet:
              path: /readyz
              port: health
            periodSeconds: 10
            timeoutSeconds: 5
          # Privileged: the health check opens the GPU device nodes (the device cgroup
          # denies them to an unprivileged container that was allocated no device) and
          # the plugin serves its socket in the kubelet's root-owned device-plugins dir.
          securityContext:
            privileged: true
            readOnlyRootFilesystem: true
          {{- with include "gpuk8s.resources" $ctx | trim }}{{ . | nindent 10 }}{{ end }}
          volumeMounts:
            - name: device-plugins
              mountPath: /var/lib/kubelet/device-plugins
            - name: pod-resources
              mountPath: /var/lib/kubelet/pod-resources
              readOnly: true
            {{- include "gpuk8s.hostReadMounts" $root | trim | nindent 12 }}
            {{- with include "gpuk8s.logVolumeMount" $ctx | trim }}{{ . | nindent 12 }}{{ end }}
      volumes:
        - name: device-plugins
          hostPath:
            path: {{ $root.Values.hostPaths.devicePlugins | quote }}
            type: Directory
        - name: pod-resources
          hostPath:
            path: {{ $root.Values.hostPaths.podResources | quote }}
            type: Directory
        {{- include "gpuk8s.hostReadVolumes" $root | trim | nindent 8 }}
        {{- with include "gpuk8s.logVolume" $ctx | trim }}{{ . | nindent 8 }}{{ end }}
{{- end -}}
