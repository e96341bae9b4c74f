{{/*
gpu-exporter: per-GPU and per-container GPU metrics (DaemonSet + headless Service), with
a ServiceMonitor and a PrometheusRule (the recording rules) when the Prometheus Operator's
CRDs exist, and prometheus.io/* scrape annotations otherwise.
Context: root, requiredLabels (node labels the DaemonSet waits for).
*/}}
{{- define "gpuk8s.gpuExporter" -}}
{{- $root := .root -}}
{{- $v := $root.Values.gpuExporter -}}
{{- $ctx := dict "root" $root "component" "gpu-exporter" "values" $v -}}
{{- $monitor := $root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor" -}}
{{- $rules := and $v.prometheusRule ($root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule") -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpu-exporter
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
automountServiceAccountToken: true
---
# Attribution of GPU processes to pods: the exporter lists the pods of its own node
# (fieldSelector spec.nodeName) to map container IDs to namespace/pod/container.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["list"]
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
    name: gpu-exporter
    namespace: {{ $root.Release.Namespace }}
---
# Headless: Prometheus scrapes every exporter pod (one per GPU node), not a virtual IP.
apiVersion: v1
kind: Service
metadata:
  name: gpu-exporter
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  {{- if not $monitor }}
  annotations:
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $v.port | quote }}
    prometheus.io/path: "/metrics"
  {{- end }}
spec:
  clusterIP: None
  selector:
    {{- include "gpuk8s.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: metrics
      port: {{ $v.port }}
      targetPort: metrics
      protocol: TCP
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: gpu-exporter
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
      {{- if not $monitor }}
      annotations:
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $v.port | quote }}
        prometheus.io/path: "/metrics"
      {{- end }}
    spec:
      serviceAccountName: gpu-exporter
      priorityClassName: system-node-critical
      {{- with include "gpuk8s.imagePullSecrets" $root | trim }}{{ . | nindent 6 }}{{ end }}
      {{- include "gpuk8s.nodeAgentPlacement" (dict "root" $root "affinity" .) | trim | nindent 6 }}
      tolerations:
        {{- include "gpuk8s.nodeAgentTolerations" $root | nindent 8 }}
      securityContext:
        {{- include "gpuk8s.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: gpu-exporter
          image: {{ include "gpuk8s.image" $ctx | quote }}
          imagePullPolicy: {{ $root.Values.pullPolicy | quote }}
          command: ["gpuk8s"]
          args:
            - serve
            - exporter
            - --host-root=/host
            - --proc-dir=/host-proc
            - --port={{ $v.port }}
            - --interval={{ $v.interval }}
            - --state-file=/var/lib/gpuk8s/exporter/gpus.json
            {{- range $name, $kind := $v.resourceKinds }}
            - {{ printf "--resource-kind=%s=%s" $name $kind | quote }}
            {{- end }}
            {{- range $v.extraArgs }}
            - {{ . | quote }}
            {{- end }}
            {{- include "gpuk8s.logArgs" $ctx | nindent 12 }}
          env:
            {{- include "gpuk8s.nodeNameEnv" $root | nindent 12 }}
          ports:
            - name: metrics
              containerPort: {{ $v.port }}
              protocol: TCP
          readinessProbe:
            httpGet:
              path: /healthz
              port: metrics
            periodSeconds: 10
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            initialDelaySeconds: 30
            periodSeconds: 30
            failureThreshold: 3
          # Privileged: the vendor tools (mx-smi, NVML) open the GPUs' device nodes, which
          # the device cgroup denies to a container that was allocated no device.
          securityContext:
            privileged: true
            readOnlyRootFilesystem: true
          {{- with include "gpuk8s.resources" $ctx | trim }}{{ . | nindent 10 }}{{ end }}
          volumeMounts:
            - name: pod-resources
              mountPath: /var/lib/kubelet/pod-resources
              readOnly: true
            - name: host-root
              mountPath: /host
              readOnly: true
              mountPropagation: HostToContainer
            - name: host-proc
              mountPath: /host-proc
              readOnly: true
            # the book of known GPUs (stable gpu labels, lost GPUs): where a restarted
            # exporter finds it, and `gpuk8s exporter forget` (kubectl exec) edits it
            - name: state
              mountPath: /var/lib/gpuk8s/exporter
            {{- with include "gpuk8s.logVolumeMount" $ctx | trim }}{{ . | nindent 12 }}{{ end }}
      volumes:
        - name: pod-resources
          hostPath:
            path: {{ $root.Values.hostPaths.podResources | quote }}
            type: Directory
        - name: host-root
          hostPath:
            path: {{ $root.Values.hostPaths.root | quote }}
            type: Directory
        - name: host-proc
          hostPath:
            path: {{ $root.Values.hostPaths.proc | quote }}
            type: Directory
        - name: state
          hostPath:
            path: {{ include "gpuk8s.hostPath" (dict "root" $root "path" "/var/lib/gpuk8s/exporter") }}
            type: DirectoryOrCreate
        {{- with include "gpuk8s.logVolume" $ctx | trim }}{{ . | nindent 8 }}{{ end }}
{{- if $monitor }}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: gpu-exporter
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "gpuk8s.selectorLabels" $ctx | nindent 6 }}
  namespaceSelector:
    matchNames: [{{ $root.Release.Namespace | quote }}]
  endpoints:
    - port: metrics
      path: /metrics
      interval: {{ printf "%ds" (int $v.scrapeInterval) | quote }}
      # the exporter's namespace/pod/node labels name the GPU's user, not the exporter pod
      honorLabels: true
{{- end }}
{{- if $rules }}
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: gpu-exporter
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  {{- include "gpuk8s.gpuExporterRules" . | nindent 2 }}
{{- end }}
{{- end -}}
