{{/*
gpu-aware: the scheduler extender (Deployment + Service on 8080 + ConfigMap of weights),
rendered only with deployExtenderGPUAware=true. kube-scheduler reaches it through the
Service's cluster IP (SPEC §7), so the Service name is fixed: gpu-aware.
With gpuAware.tls.enabled (the default) port 8080 speaks HTTPS and admits only clients
with a certificate of the chart's client CA (kube-scheduler's tlsConfig, files the
gpu_aware role copies from Secret gpu-aware-scheduler-client); the health endpoints are
plain HTTP on gpuAware.healthPort (the kubelet's probes, Prometheus). A NetworkPolicy
admits only the control-plane nodes to port 8080 (gpuk8s.gpuAwareNetworkPolicy).
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
{{- $tls := $root.Values.gpuAware.tls.enabled -}}
{{- $health := int $root.Values.gpuAware.healthPort -}}
{{- if $tls }}
{{- $certs := include "gpuk8s.gpuAwareTls" $root | fromJson }}
# TLS (docs/extender.md): two CAs made by the chart and kept across upgrades (lookup);
# the certificates they sign are re-issued by the first `helm upgrade` within
# gpuAware.tls.renewBeforeDays of their expiry. gpu-aware re-reads its files when the
# kubelet updates this Secret; kube-scheduler's client files are copied by the gpu_aware
# role (playbooks/gpu_aware.yml), which restarts it when they changed.
apiVersion: v1
kind: Secret
metadata:
  name: gpu-aware-ca
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  annotations:
    metax-tech.com/server-ca-not-after: {{ $certs.server.caNotAfter | quote }}
    metax-tech.com/client-ca-not-after: {{ $certs.client.caNotAfter | quote }}
type: Opaque
data:
  server-ca.crt: {{ $certs.server.caCrt }}
  server-ca.key: {{ $certs.server.caKey }}
  client-ca.crt: {{ $certs.client.caCrt }}
  client-ca.key: {{ $certs.client.caKey }}
---
# gpu-aware's own: its certificate (names gpu-aware.<namespace>.svc) and the CA its
# clients' certificates must come from
apiVersion: v1
kind: Secret
metadata:
  name: gpu-aware-tls
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  annotations:
    metax-tech.com/not-after: {{ $certs.server.notAfter | quote }}
type: kubernetes.io/tls
data:
  tls.crt: {{ $certs.server.crt }}
  tls.key: {{ $certs.server.key }}
  client-ca.crt: {{ $certs.client.caCrt }}
---
# kube-scheduler's: its client certificate and the CA that signed gpu-aware's
apiVersion: v1
kind: Secret
metadata:
  name: gpu-aware-scheduler-client
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  annotations:
    metax-tech.com/not-after: {{ $certs.client.notAfter | quote }}
    metax-tech.com/server-name: {{ printf "gpu-aware.%s.svc" $root.Release.Namespace | quote }}
type: kubernetes.io/tls
data:
  tls.crt: {{ $certs.client.crt }}
  tls.key: {{ $certs.client.key }}
  ca.crt: {{ $certs.server.caCrt }}
---
{{- end }}
{{- with include "gpuk8s.gpuAwareNetworkPolicy" $ctx | trim }}
{{ . }}
---
{{- end }}
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
    - name: {{ ternary "https" "http" $tls }}
      port: 8080
      targetPort: extender
      protocol: TCP
    - name: health
      port: {{ $health }}
      targetPort: health
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
        {{- if $tls }}
        # the TLS Secret's files (mode 0440) belong to this group: uid 65532 reads them
        fsGroup: {{ $uid }}
        {{- end }}
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
            - --health-port={{ $health }}
            - --config-dir=/etc/gpu-aware
            {{- if $tls }}
            - --tls-cert-file=/etc/gpu-aware-tls/tls.crt
            - --tls-key-file=/etc/gpu-aware-tls/tls.key
            - --tls-client-ca-file=/etc/gpu-aware-tls/client-ca.crt
            {{- end }}
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
            - name: extender
              containerPort: 8080
              protocol: TCP
            - name: health
              containerPort: {{ $health }}
              protocol: TCP
          # ready once the node cache is synced (until then filter can only say "retry");
          # plain HTTP on a listener of its own: no client certificate, and never behind
          # the extender port's clients
          readinessProbe:
            httpGet:
              path: /readyz
              port: health
            periodSeconds: 5
          livenessProbe:
            httpGet:
              path: /healthz
              port: health
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
            {{- if $tls }}
            - name: tls
              mountPath: /etc/gpu-aware-tls
              readOnly: true
            {{- end }}
            {{- with include "gpuk8s.logVolumeMount" $ctx | trim }}{{ . | nindent 12 }}{{ end }}
      volumes:
        - name: weights
          configMap:
            name: gpu-aware-plugin
        {{- if $tls }}
        - name: tls
          secret:
            secretName: gpu-aware-tls
            defaultMode: 0440
        {{- end }}
        {{- with include "gpuk8s.logVolume" $ctx | trim }}{{ . | nindent 8 }}{{ end }}
{{- end }}
{{- end -}}


{{/*
The weights of ConfigMap gpu-aware-plugin as YAML (scoreWeight, lossWeight, chart, notes).
Administrators edit them live (the manual: `kubectl edit cm`), and `helm upgrade --set
gpuAware.scoreWeight=...` changes them too; key by key, a three-way merge decides: the
ConfigMap records what the chart last rendered (annotation metax-tech.com/chart-weights),
* a chart value that differs from that record is a new decision: it applies, replacing a
  live edit of that key;
* otherwise a live value that differs from the record is an edit: it stays;
* otherwise the chart's value.
A ConfigMap of an older release (named gpu-aware, or without a record) keeps its weights.
`notes` says what happened to each live edit (NOTES.txt prints it) and, for one that
stays, the command that replaces it. With helm 4's server-side apply, replacing a value
`kubectl edit` / `kubectl replace` set conflicts with that field manager: the upgrade then
stops, naming it, and leaves the release `failed`; the same upgrade with
`--force-conflicts` lets the chart's value in (docs/extender.md).
Context: root.
*/}}
{{- define "gpuk8s.gpuAwareWeights" -}}
{{- $ns := .Release.Namespace -}}
{{- $chart := dict "scoreWeight" (toString .Values.gpuAware.scoreWeight) "lossWeight" (toString .Values.gpuAware.lossWeight) -}}
{{- $out := deepCopy $chart -}}
{{- $notes := list -}}
{{- $live := lookup "v1" "ConfigMap" $ns "gpu-aware-plugin" -}}
{{- if not $live }}{{ $live = lookup "v1" "ConfigMap" $ns "gpu-aware" }}{{ end -}}
{{- if and $live $live.data -}}
{{- $recorded := splitList "/" (get ($live.metadata.annotations | default dict) "metax-tech.com/chart-weights") -}}
{{- range $i, $key := list "scoreWeight" "lossWeight" -}}
{{- if hasKey $live.data $key -}}
{{- $now := get $live.data $key -}}
{{- $new := get $chart $key -}}
{{- if ne (len $recorded) 2 -}}
{{- /* no record (an older release): what is in the cluster stays */ -}}
{{- $_ := set $out $key $now -}}
{{- else if ne (index $recorded $i) $new -}}
{{- if ne $now (index $recorded $i) -}}
{{- $notes = append $notes (printf "gpuAware.%s: the chart's new value %s replaced the live edit %s" $key $new $now) -}}
{{- end -}}
{{- else if ne $now (index $recorded $i) -}}
{{- $_ := set $out $key $now -}}
{{- $notes = append $notes (printf "gpuAware.%s: the live edit %s stays (the chart's %s is unchanged; helm upgrade %s <CHART> -n %s --reuse-values --set gpuAware.%s=<a new value> --force-conflicts replaces it)" $key $now $new $.Release.Name $ns $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
scoreWeight: {{ $out.scoreWeight | quote }}
lossWeight: {{ $out.lossWeight | quote }}
chart: {{ printf "%s/%s" $chart.scoreWeight $chart.lossWeight | quote }}
notes: {{ toJson $notes }}
{{- end -}}


{{/*
TLS material of gpu-aware as JSON: for "server" and "client", the CA (caCrt, caKey,
caNotAfter) and the certificate it signs (crt, key, notAfter), base64 as a Secret holds
them. What the cluster has is kept (lookup of the Secrets): a CA until
gpuAware.tls.renewBeforeDays before it expires, a certificate likewise and as long as its
CA stays; otherwise a new one is made (sprig genCA / genSignedCert, RSA 2048). Without a
cluster (helm template) everything is new at each render.
Context: root.
*/}}
{{- define "gpuk8s.gpuAwareTls" -}}
{{- $ns := .Release.Namespace -}}
{{- $v := .Values.gpuAware.tls -}}
{{- if ge (int $v.renewBeforeDays) (int $v.validityDays) -}}
{{- fail (printf "gpuAware.tls.renewBeforeDays (%v) must be less than gpuAware.tls.validityDays (%v): every upgrade would issue new certificates" $v.renewBeforeDays $v.validityDays) -}}
{{- end -}}
{{- if ge (int $v.renewBeforeDays) (int $v.caValidityDays) -}}
{{- fail (printf "gpuAware.tls.renewBeforeDays (%v) must be less than gpuAware.tls.caValidityDays (%v)" $v.renewBeforeDays $v.caValidityDays) -}}
{{- end -}}
{{- $now := now | unixEpoch | int64 -}}
{{- $margin := mul (int64 $v.renewBeforeDays) 86400 -}}
{{- $ca := lookup "v1" "Secret" $ns "gpu-aware-ca" | default dict -}}
{{- $caData := $ca.data | default dict -}}
{{- $caNotes := (($ca.metadata | default dict).annotations) | default dict -}}
{{- $out := dict -}}
{{- range $role, $leafName := dict "server" "gpu-aware-tls" "client" "gpu-aware-scheduler-client" -}}
{{- $caAfter := int64 (get $caNotes (printf "metax-tech.com/%s-ca-not-after" $role) | default "0") -}}
{{- $crt := get $caData (printf "%s-ca.crt" $role) -}}
{{- $key := get $caData (printf "%s-ca.key" $role) -}}
{{- $item := dict -}}
{{- $authority := dict -}}
{{- if and $crt $key (gt (sub $caAfter $margin) $now) -}}
{{- $authority = buildCustomCert $crt $key -}}
{{- $_ := set $item "caCrt" $crt -}}
{{- $_ := set $item "caKey" $key -}}
{{- $_ := set $item "caNotAfter" (toString $caAfter) -}}
{{- $_ := set $item "caKept" true -}}
{{- else -}}
{{- $authority = genCA (printf "gpu-aware %s CA" $role) (int $v.caValidityDays) -}}
{{- $_ := set $item "caCrt" (b64enc $authority.Cert) -}}
{{- $_ := set $item "caKey" (b64enc $authority.Key) -}}
{{- $_ := set $item "caNotAfter" (toString (add $now (mul (int64 $v.caValidityDays) 86400))) -}}
{{- $_ := set $item "caKept" false -}}
{{- end -}}
{{- $leaf := lookup "v1" "Secret" $ns $leafName | default dict -}}
{{- $leafData := $leaf.data | default dict -}}
{{- $leafAfter := int64 (get ((($leaf.metadata | default dict).annotations) | default dict) "metax-tech.com/not-after" | default "0") -}}
{{- if and $item.caKept (get $leafData "tls.crt") (get $leafData "tls.key") (gt (sub $leafAfter $margin) $now) -}}
{{- $_ := set $item "crt" (get $leafData "tls.crt") -}}
{{- $_ := set $item "key" (get $leafData "tls.key") -}}
{{- $_ := set $item "notAfter" (toString $leafAfter) -}}
{{- else -}}
{{- $cert := dict -}}
{{- if eq $role "server" -}}
{{- $names := list "gpu-aware" (printf "gpu-aware.%s" $ns) (printf "gpu-aware.%s.svc" $ns) (printf "gpu-aware.%s.svc.cluster.local" $ns) -}}
{{- $cert = genSignedCert "gpu-aware" nil $names (int $v.validityDays) $authority -}}
{{- else -}}
{{- $cert = genSignedCert "kube-scheduler" nil nil (int $v.validityDays) $authority -}}
{{- end -}}
{{- $_ := set $item "crt" (b64enc $cert.Cert) -}}
{{- $_ := set $item "key" (b64enc $cert.Key) -}}
{{- $_ := set $item "notAfter" (toString (add $now (mul (int64 $v.validityDays) 86400))) -}}
{{- end -}}
{{- $_ := set $out $role $item -}}
{{- end -}}
{{ toJson $out }}
{{- end -}}


{{/*
NetworkPolicy of gpu-aware. It fails closed: with gpuAware.networkPolicy.enabled (the
default) every render has the policy or stops, naming the value to set -- never a render
without one (helm template, GitOps, a cluster whose control-plane nodes carry no known
role label). Port 8080 (the extender verbs) admits only the hosts kube-scheduler runs on
(gpuk8s.gpuAwareSchedulerSources); the health port (/healthz, /readyz, /metrics) admits
gpuAware.networkPolicy.healthFrom (e.g. Prometheus's namespace) and the release's `helm test`
pod. The kubelet's probes need
no rule: traffic from the node a pod runs on is always allowed (NetworkPolicy semantics).
Enforced only where the CNI implements NetworkPolicy; client certificates are gpu-aware's
authentication in any case.
Context: root, component, values.
*/}}
{{- define "gpuk8s.gpuAwareNetworkPolicy" -}}
{{- $root := .root -}}
{{- $v := $root.Values.gpuAware.networkPolicy -}}
{{- if $v.enabled -}}
{{- $sources := include "gpuk8s.gpuAwareSchedulerSources" $root | fromJsonArray -}}
{{- if not $sources -}}
{{- fail "gpuAware.networkPolicy: the hosts kube-scheduler runs on are unknown (no Node labelled node-role.kubernetes.io/control-plane or node-role.kubernetes.io/master was found: helm template, or such a cluster), so the NetworkPolicy of gpu-aware cannot admit it; set gpuAware.networkPolicy.controlPlaneCIDRs to their addresses (e.g. --set gpuAware.networkPolicy.controlPlaneCIDRs={192.0.2.10/32}), or gpuAware.networkPolicy.enabled=false to deploy gpu-aware without a NetworkPolicy on purpose" -}}
{{- end -}}
# Only kube-scheduler's hosts may call the extender (it runs on the host network)
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: gpu-aware
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "gpuk8s.selectorLabels" . | nindent 6 }}
  policyTypes: [Ingress]
  ingress:
    - ports:
        - port: 8080
          protocol: TCP
      from:
        {{- range $sources }}
        - ipBlock:
            cidr: {{ . | quote }}
        {{- end }}
    # the release's own `helm test` pod (templates/tests: it checks gpu-aware answers)
    - ports:
        - port: {{ int $root.Values.gpuAware.healthPort }}
          protocol: TCP
      from:
        - podSelector:
            matchLabels:
              {{- include "gpuk8s.selectorLabels" (dict "root" $root "component" "gpu-test") | nindent 14 }}
        {{- with $v.healthFrom }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end -}}
{{- end -}}


{{/*
The sources admitted to gpu-aware's extender port, as a JSON array of CIDRs (sorted,
unique): gpuAware.networkPolicy.controlPlaneCIDRs, plus for each Node labelled
node-role.kubernetes.io/control-plane (or the older .../master) found by lookup at
install/upgrade its InternalIP addresses and the two addresses its own host traffic
leaves through the CNI with: the first address of each pod CIDR (a bridge CNI's gateway)
and the CIDR's network address (flannel's VXLAN tunnel), as single hosts -- never the
pod CIDR itself, whose pods are not kube-scheduler. Other CNIs' tunnel addresses go in
controlPlaneCIDRs. Context: root.
*/}}
{{- define "gpuk8s.gpuAwareSchedulerSources" -}}
{{- $cidrs := list -}}
{{- range (lookup "v1" "Node" "" "").items | default list -}}
{{- $labels := .metadata.labels | default dict -}}
{{- if or (hasKey $labels "node-role.kubernetes.io/control-plane") (hasKey $labels "node-role.kubernetes.io/master") -}}
{{- range (.status | default dict).addresses | default list -}}
{{- if eq .type "InternalIP" -}}
{{- $cidrs = append $cidrs (printf "%s/%s" .address (ternary "128" "32" (contains ":" .address))) -}}
{{- end -}}
{{- end -}}
{{- range (.spec | default dict).podCIDRs | default list -}}
{{- $net := first (splitList "/" .) -}}
{{- if contains ":" $net -}}
{{- $cidrs = append $cidrs (printf "%s/128" $net) -}}
{{- if hasSuffix "::" $net }}{{ $cidrs = append $cidrs (printf "%s1/128" $net) }}{{ end -}}
{{- else -}}
{{- $octets := splitList "." $net -}}
{{- $cidrs = append $cidrs (printf "%s/32" $net) -}}
{{- $cidrs = append $cidrs (printf "%s.%d/32" (join "." (initial $octets)) (add1 (int (last $octets)))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $cidrs = concat $cidrs $.Values.gpuAware.networkPolicy.controlPlaneCIDRs -}}
{{ $cidrs | uniq | sortAlpha | toJson }}
{{- end -}}
