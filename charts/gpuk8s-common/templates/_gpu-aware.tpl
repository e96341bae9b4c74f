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
{{- $weights := include "gpuk8s.gpuAwareWeights" $root | fromYaml -}}
{{- /* more than one replica: only the holder of the Lease books shared GPUs, and the
Service sends kube-scheduler to it (the pod it labels); see docs/extender.md */ -}}
{{- $elect := gt (int $root.Values.gpuAware.replicas) 1 -}}
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
# requested, shared-GPU assignments) by watching them. GPU sharing (the bind verb): it
# records the chosen GPUs on the pod (patch) and binds it (pods/binding); nothing else.
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
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["patch"]
  - apiGroups: [""]
    resources: ["pods/binding"]
    verbs: ["create"]
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
    resourceNames: ["gpu-aware-plugin"]
    verbs: ["get"]
  {{- if $elect }}
  # leader election: the Lease gpu-aware (create cannot be limited to a name)
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["create"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: ["gpu-aware"]
    verbs: ["get", "update"]
  {{- end }}
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
# Edit these to change the weights (`kubectl edit configmap gpu-aware-plugin`); gpu-aware
# reloads them without a restart, and `helm upgrade` keeps the edit unless the chart's
# own weights changed (gpuk8s.gpuAwareWeights).
apiVersion: v1
kind: ConfigMap
metadata:
  name: gpu-aware-plugin
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  annotations:
    metax-tech.com/chart-weights: {{ $weights.chart | quote }}
data:
  scoreWeight: {{ $weights.scoreWeight | quote }}
  lossWeight: {{ $weights.lossWeight | quote }}
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
    {{- if $elect }}
    gpuk8s.io/gpu-aware-leader: "true"
    {{- end }}
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
  replicas: {{ int $root.Values.gpuAware.replicas }}
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
        {{- if $elect }}
        # one replica per control-plane node where there are several (SPEC §1)
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "gpuk8s.selectorLabels" $ctx | nindent 20 }}
        {{- end }}
      tolerations:
        {{- include "gpuk8s.controlPlaneTolerations" $root | nindent 8 }}
      securityContext:
        {{- include "gpuk8s.podSecurityContext" $root | nindent 8 }}
      {{- with include "gpuk8s.logDirInit" $ctx | trim }}
      initContainers:
        {{- . | nindent 8 }}
      {{- end }}
      containers:
        - name: gpu-aware
          image: {{ include "gpuk8s.image" $ctx | quote }}
          imagePullPolicy: {{ $root.Values.pullPolicy | quote }}
          command: ["gpuk8s"]
          args:
            - serve
            - extender
            - --port=8080
            - --config-dir=/etc/gpu-aware
            # nodeCacheCapable: true (the gpu_aware role's default) needs the node watch;
            # requests with full Node objects are answered as well
            - --node-cache
            {{- if $elect }}
            - --leader-elect
            {{- end }}
            {{- range $root.Values.gpuAware.extraArgs }}
            - {{ . | quote }}
            {{- end }}
            {{- include "gpuk8s.logArgs" $ctx | nindent 12 }}
          env:
            {{- include "gpuk8s.nodeNameEnv" $root | nindent 12 }}
            - name: POD_NAME  # the identity in the Lease, the pod the leader labels
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
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
            timeoutSeconds: 5
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
            name: gpu-aware-plugin
        {{- with include "gpuk8s.logVolume" $ctx | trim }}{{ . | nindent 8 }}{{ end }}
{{- end }}
{{- end -}}


{{/*
The weights of ConfigMap gpu-aware-plugin as YAML (scoreWeight, lossWeight, chart).
Administrators edit them live (the manual: `kubectl edit cm`), so an upgrade keeps what is
in the cluster - the way driver-config keeps its vfnums - key by key, like a three-way
merge: the ConfigMap records what the chart last rendered (annotation
metax-tech.com/chart-weights); a weight that differs from that record was edited and
stays, one that does not follows the chart (`--set gpuAware.scoreWeight=...`). So an upgrade
never resets an edit and never conflicts with its field manager (helm 4 applies
server-side). A ConfigMap of an older release (named gpu-aware, no record) keeps its
weights.
Context: root.
*/}}
{{- define "gpuk8s.gpuAwareWeights" -}}
{{- $ns := .Release.Namespace -}}
{{- $chart := dict "scoreWeight" (toString .Values.gpuAware.scoreWeight) "lossWeight" (toString .Values.gpuAware.lossWeight) -}}
{{- $out := deepCopy $chart -}}
{{- $live := lookup "v1" "ConfigMap" $ns "gpu-aware-plugin" -}}
{{- if not $live }}{{ $live = lookup "v1" "ConfigMap" $ns "gpu-aware" }}{{ end -}}
{{- if and $live $live.data -}}
{{- $recorded := splitList "/" (get ($live.metadata.annotations | default dict) "metax-tech.com/chart-weights") -}}
{{- range $i, $key := list "scoreWeight" "lossWeight" -}}
{{- /* key by key: a value edited in the cluster (it differs from what the chart last
rendered, or there is no record of that) stays; an unedited one follows the chart */ -}}
{{- if hasKey $live.data $key -}}
{{- if or (ne (len $recorded) 2) (ne (index $recorded $i) (get $live.data $key)) -}}
{{- $_ := set $out $key (get $live.data $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
scoreWeight: {{ $out.scoreWeight | quote }}
lossWeight: {{ $out.lossWeight | quote }}
chart: {{ printf "%s/%s" $chart.scoreWeight $chart.lossWeight | quote }}
{{- end -}}
