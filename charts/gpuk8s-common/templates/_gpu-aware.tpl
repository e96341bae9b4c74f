{{/*
gpu-aware: the scheduler extender (Deployment + Service on 8080 + ConfigMap of weights),
rendered only with deployExtenderGPUAware=true. kube-scheduler reaches it through the
Service's cluster IP (SPEC §7), so the Service name is fixed: gpu-aware.
Context: root.
*/}}
{{- define "gpuk8s.gpuAware" -}}
{{- $root := .root -}}
{{- if $root.Values.deployExtenderGPUAware }}
{{- $ctx := dict "root" $root "component" "gpu-aware" "values" $root.Values.gpuAware -}}
{{- $uid := include "gpuk8s.deploymentUid" $ctx | int -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpu-aware
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
automountServiceAccountToken: true
---
# The extender caches nodes (their GPU topology annotations) and pods (GPUs already
# requested) by watching them; it writes nothing.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["nodes", "pods"]
    verbs: ["get", "list", "watch"]
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
    name: gpu-aware
    namespace: {{ $root.Release.Namespace }}
---
# Weights are read from the mounted files (the kubelet refreshes them on edit); reading
# its own ConfigMap through the API is allowed as well, and nothing else in the namespace.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: gpu-aware
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    resourceNames: ["gpu-aware"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: gpu-aware
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: gpu-aware
subjects:
  - kind: ServiceAccount
    name: gpu-aware
    namespace: {{ $root.Release.Namespace }}
---
# Node priority = scoreWeight x score - lossWeight x loss (normalised to 0..10).
# Edit these to change the weights; gpu-aware reloads them without a restart.
apiVersion: v1
kind: ConfigMap
metadata:
  name: gpu-aware
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
data:
  scoreWeight: {{ $root.Values.gpuAware.scoreWeight | toString | quote }}
  lossWeight: {{ $root.Values.gpuAware.lossWeight | toString | quote }}
---
apiVersion: v1
kind: Service
metadata:
  name: gpu-aware
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "gpuk8s.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: http
      port: 8080
      targetPort: http
      protocol: TCP
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: gpu-aware
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  replicas: 1
  selector:
    matchLabels:
      {{- include "gpuk8s.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "gpuk8s.labels" $ctx | nindent 8 }}
      annotations:
        # Roll the pod when the weights' defaults change with an upgrade (live edits of
        # the ConfigMap are picked up without a restart).
        checksum/weights: {{ printf "%v/%v" $root.Values.gpuAware.scoreWeight $root.Values.gpuAware.lossWeight | sha256sum | trunc 16 }}
    spec:
      serviceAccountName: gpu-aware
      # Every pod's scheduling goes through the extender (ignorable: false): it is as
      # critical as the scheduler itself.
      priorityClassName: system-cluster-critical
      {{- with include "gpuk8s.imagePullSecrets" $root | trim }}{{ . | nindent 6 }}{{ end }}
      nodeSelector:
        kubernetes.io/os: linux
      affinity:
        {{- include "gpuk8s.preferControlPlane" $root | nindent 8 }}
      tolerations:
        {{- include "gpuk8s.controlPlaneTolerations" $root | nindent 8 }}
      securityContext:
        {{- include "gpuk8s.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: gpu-aware
          image: {{ include "gpuk8s.image" $ctx }}
          imagePullPolicy: {{ $root.Values.pullPolicy }}
          command: ["gpuk8s"]
          args:
            - serve
            - extender
            - --port=8080
            - --config-dir=/etc/gpu-aware
            # nodeCacheCapable: true (the gpu_aware role's default) needs the node watch;
            # requests with full Node objects are answered as well
            - --node-cache
            {{- range $root.Values.gpuAware.extraArgs }}
            - {{ . | quote }}
            {{- end }}
            {{- include "gpuk8s.logArgs" $ctx | nindent 12 }}
          env:
            {{- include "gpuk8s.nodeNameEnv" $root | nindent 12 }}
          ports:
            - name: http
              containerPort: 8080
              protocol: TCP
          # ready once the node cache is synced (until then filter can only say "retry")
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
            periodSeconds: 5
          livenessProbe:
            httpGet:
              path: /healthz
              port: http
            initialDelaySeconds: 10
            periodSeconds: 20
          securityContext:
            {{- include "gpuk8s.restrictedSecurityContext" (dict "uid" $uid) | nindent 12 }}
          {{- with include "gpuk8s.resources" $ctx | trim }}{{ . | nindent 10 }}{{ end }}
          volumeMounts:
            - name: weights
              mountPath: /etc/gpu-aware
              readOnly: true
            {{- with include "gpuk8s.logVolumeMount" $ctx | trim }}{{ . | nindent 12 }}{{ end }}
      volumes:
        - name: weights
          configMap:
            name: gpu-aware
        {{- with include "gpuk8s.logVolume" $ctx | trim }}{{ . | nindent 8 }}{{ end }}
{{- end }}
{{- end -}}
