{{/*
gpu-dra: the DRA driver gpu.metax-tech.com (resource.k8s.io/v1), its DeviceClasses, RBAC and
the admission policy that limits it to its own node's ResourceSlices.
It runs only on nodes labelled gpuk8s.io/allocation-mode=dra (and gpu.installed /
driver.ready, as gpu-device); gpu-device stays off those nodes (gpuk8s.gpuDevice), so a
node is served by one of them, never both.
Context: root, requiredLabels, schemeArgs (flags the scheme adds, e.g. --mount-sdk).
*/}}
{{- define "gpuk8s.draModeLabel" -}}gpuk8s.io/allocation-mode{{- end -}}

{{- define "gpuk8s.gpuDra" -}}
{{- $root := .root -}}
{{- $v := $root.Values.gpuDra -}}
{{- $ctx := dict "root" $root "component" "gpu-dra" "values" $v -}}
{{- $pluginDir := printf "%s/gpu.metax-tech.com" (trimSuffix "/" $root.Values.hostPaths.kubeletPlugins) -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpu-dra
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
automountServiceAccountToken: true
---
# gpu-dra publishes its node's ResourceSlices, reads the claims the kubelet asks it to
# prepare, and reads its Node (the gpuk8s.io/sharing-mode label): nothing else.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
rules:
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceslices"]
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceclaims"]
    verbs: ["get"]
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
    name: gpu-dra
    namespace: {{ $root.Release.Namespace }}
{{- if $root.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- $user := printf "system:serviceaccount:%s:gpu-dra" $root.Release.Namespace }}
---
# RBAC cannot say "only your own node's slices": gpu-dra may write ResourceSlices of
# driver gpu.metax-tech.com whose nodeName and pool (named after the node, core/dra.py)
# are the node its pod runs on (from the pod-bound token, as the own-node Node policy
# does), nothing else: a slice in another node's pool would make the scheduler drop or
# distrust that node's slices.
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "gpuk8s.clusterName" (dict "root" $root "component" "dra-own-node") }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["resource.k8s.io"]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["resourceslices"]
  matchConditions:
    - name: gpu-dra
      expression: {{ printf "request.userInfo.username == %q" $user | quote }}
  variables:
    - name: slice
      expression: "request.operation == 'DELETE' ? oldObject : object"
    - name: node
      expression: >-
        has(request.userInfo.extra) &&
        'authentication.kubernetes.io/node-name' in request.userInfo.extra ?
        request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''
  validations:
    - expression: >-
        variables.node != '' && has(variables.slice.spec.nodeName) &&
        variables.slice.spec.nodeName == variables.node &&
        variables.slice.spec.driver == 'gpu.metax-tech.com' &&
        variables.slice.spec.pool.name == variables.node &&
        (request.operation != 'UPDATE' || (has(oldObject.spec.nodeName) &&
         oldObject.spec.nodeName == variables.node && oldObject.spec.pool.name == variables.node))
      messageExpression: >-
        request.userInfo.username + ' may write only ResourceSlices of driver
        gpu.metax-tech.com for the node its pod runs on (' + variables.node + '), not ' +
        variables.slice.metadata.name
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "gpuk8s.clusterName" (dict "root" $root "component" "dra-own-node") }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  policyName: {{ include "gpuk8s.clusterName" (dict "root" $root "component" "dra-own-node") }}
  validationActions: [Deny]
{{- end }}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: metax-gpu-dra
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
      serviceAccountName: gpu-dra
      priorityClassName: system-node-critical
      {{- with include "gpuk8s.imagePullSecrets" $root | trim }}{{ . | nindent 6 }}{{ end }}
      {{- include "gpuk8s.nodeAgentPlacement" (dict "root" $root "affinity" (dict "requiredLabels" (merge (dict (include "gpuk8s.draModeLabel" .) "dra") .requiredLabels))) | trim | nindent 6 }}
      tolerations:
        {{- include "gpuk8s.nodeAgentTolerations" $root | nindent 8 }}
      securityContext:
        {{- include "gpuk8s.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: gpu-dra
          image: {{ include "gpuk8s.image" $ctx | quote }}
          imagePullPolicy: {{ $root.Values.pullPolicy | quote }}
          command: ["gpuk8s"]
          args:
            - serve
            - dra-plugin
            - --host-root=/host
            - {{ printf "--healthy-interval=%v" $v.healthyInterval | quote }}
            - {{ printf "--plugin-dir=%s" $pluginDir | quote }}
            - {{ printf "--registry-dir=%s" (trimSuffix "/" $root.Values.hostPaths.pluginsRegistry) | quote }}
            - {{ printf "--cdi-dir=%s" (trimSuffix "/" $root.Values.hostPaths.cdi) | quote }}
            - {{ printf "--group-devices=%s" (get (dict "true" "on" "false" "off" "auto" "auto") (toString $v.groupDevices)) | quote }}
            - {{ printf "--unhealthy-devices=%s" $v.unhealthyDevices | quote }}
            - --sharing-mode=auto
            {{- with trimSuffix "/" $root.Values.hostPaths.root }}
            # the host tree is not the node's /: device paths in CDI specs live under it
            - {{ printf "--device-path-prefix=%s" . | quote }}
            {{- end }}
            - --health-port=8083
            {{- range .schemeArgs }}
            - {{ . | quote }}
            {{- end }}
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
          # live: the socket server, the slice publisher and the health loop run;
          # ready: registered with the kubelet and the slices published
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
          # Privileged: the health check opens the GPU device nodes, and the plugin serves
          # its sockets in the kubelet's root-owned directories and writes CDI specs.
          securityContext:
            privileged: true
            readOnlyRootFilesystem: true
          {{- with include "gpuk8s.resources" $ctx | trim }}{{ . | nindent 10 }}{{ end }}
          volumeMounts:
            # the kubelet dials the socket path gpu-dra registers: same path inside and out
            - name: plugin
              mountPath: {{ $pluginDir | quote }}
            - name: plugins-registry
              mountPath: {{ trimSuffix "/" $root.Values.hostPaths.pluginsRegistry | quote }}
            - name: cdi
              mountPath: {{ trimSuffix "/" $root.Values.hostPaths.cdi | quote }}
            {{- include "gpuk8s.hostReadMounts" $root | trim | nindent 12 }}
            {{- with include "gpuk8s.logVolumeMount" $ctx | trim }}{{ . | nindent 12 }}{{ end }}
      volumes:
        - name: plugin
          hostPath:
            path: {{ $pluginDir | quote }}
            type: DirectoryOrCreate
        - name: plugins-registry
          hostPath:
            path: {{ trimSuffix "/" $root.Values.hostPaths.pluginsRegistry | quote }}
            type: Directory
        - name: cdi
          hostPath:
            path: {{ trimSuffix "/" $root.Values.hostPaths.cdi | quote }}
            type: DirectoryOrCreate
        {{- include "gpuk8s.hostReadVolumes" $root | trim | nindent 8 }}
        {{- with include "gpuk8s.logVolume" $ctx | trim }}{{ . | nindent 8 }}{{ end }}
{{- if $v.deviceClasses }}
{{- include "gpuk8s.draDeviceClasses" $root }}
{{- end }}
{{- if $v.pending.enabled }}
{{- include "gpuk8s.gpuDraPending" $root }}
{{- end }}
{{- end -}}

{{/*
gpu-dra-pending (gpuk8s serve dra-pending, docs/dra.md "Why a pod stays pending"): reads
every pending pod, ResourceClaim and gpu-dra ResourceSlice of the cluster and writes Events
on pods whose claims gpu-dra can never serve. A Deployment of its own ServiceAccount, off
the nodes: the node agents' accounts stay limited to their node. Replicas elect one actor
with the Lease gpu-dra-pending. It logs to stdout only. Same image as gpu-dra.
*/}}
{{- define "gpuk8s.gpuDraPending" -}}
{{- $v := .Values.gpuDra -}}
{{- $ctx := dict "root" . "component" "gpu-dra-pending" "values" $v -}}
{{- $log := include "gpuk8s.log" $ctx | fromYaml }}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpu-dra-pending
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
automountServiceAccountToken: true
---
# reads pods, claims and gpu-dra's slices of the cluster; writes Events (get for the
# refresh of its own Event, patch to count it): nothing else
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
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceclaims", "resourceslices"]
    verbs: ["list"]
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["get", "create", "patch"]
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
    name: gpu-dra-pending
    namespace: {{ .Release.Namespace }}
---
# leader election: the Lease gpu-dra-pending (create cannot be limited to a name)
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: gpu-dra-pending
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["create"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: ["gpu-dra-pending"]
    verbs: ["get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: gpu-dra-pending
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: gpu-dra-pending
subjects:
  - kind: ServiceAccount
    name: gpu-dra-pending
    namespace: {{ .Release.Namespace }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: metax-gpu-dra-pending
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  replicas: {{ int $v.pending.replicas }}
  selector:
    matchLabels:
      {{- include "gpuk8s.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "gpuk8s.labels" $ctx | nindent 8 }}
    spec:
      serviceAccountName: gpu-dra-pending
      {{- with include "gpuk8s.imagePullSecrets" . | trim }}{{ . | nindent 6 }}{{ end }}
      nodeSelector:
        kubernetes.io/os: linux
      affinity:
        {{- include "gpuk8s.preferControlPlane" . | nindent 8 }}
      tolerations:
        {{- include "gpuk8s.controlPlaneTolerations" . | nindent 8 }}
      securityContext:
        {{- include "gpuk8s.podSecurityContext" . | nindent 8 }}
      containers:
        - name: gpu-dra-pending
          image: {{ include "gpuk8s.image" (dict "root" . "component" "gpu-dra" "values" $v) | quote }}
          imagePullPolicy: {{ .Values.pullPolicy | quote }}
          command: ["gpuk8s"]
          args:
            - serve
            - dra-pending
            - {{ printf "--after=%v" $v.pending.after | quote }}
            - {{ printf "--log-level=%s" $log.level | quote }}
            - {{ printf "--log-format=%s" $log.format | quote }}
            - --health-port=8084
          env:
            - name: POD_NAME  # the identity in the Lease
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE  # the Lease's namespace
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
          ports:
            - name: health
              containerPort: 8084
              protocol: TCP
          # live and ready while its rounds complete (the last within 3 intervals, >= 60 s)
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
          securityContext:
            {{- include "gpuk8s.restrictedSecurityContext" (dict "uid" (include "gpuk8s.deploymentUid" $ctx | int)) | nindent 12 }}
          {{- with include "gpuk8s.resources" $ctx | trim }}{{ . | nindent 10 }}{{ end }}
{{- end -}}

{{/*
DeviceClasses of gpu.metax-tech.com (cluster-scoped). `gpu.metax-tech.com` selects physical
GPUs only (a VF is never a GPU; VFs have vf.gpu.metax-tech.com) and, with
gpuDra.extendedResource, serves pods that still ask for `metax-tech.com/gpu`. The
group-2|4|8 classes ship only with gpuDra.groupDevices: true: `auto` publishes no group
devices on any release measured so far (docs/dra.md, Flags), and the claims policy below
says so to a claim that names one.
Context: root.
*/}}
{{- define "gpuk8s.draDeviceClasses" -}}
{{- $v := .Values.gpuDra -}}
{{- $ctx := dict "root" . "component" "gpu-dra" -}}
{{- $driver := "device.driver == 'gpu.metax-tech.com'" -}}
{{- $type := "device.attributes['gpu.metax-tech.com'].type" -}}
{{- $classes := list
  (dict "name" "gpu.metax-tech.com" "cel" (printf "%s && %s == 'gpu'" $driver $type) "extended" $v.extendedResource)
  (dict "name" "vf.gpu.metax-tech.com" "cel" (printf "%s && %s == 'vf'" $driver $type))
  (dict "name" "sgpu.gpu.metax-tech.com" "cel" (printf "%s && %s == 'gpu' && 'vcore' in device.capacity['gpu.metax-tech.com']" $driver $type))
-}}
{{- if eq (toString $v.groupDevices) "true" }}
{{- range $size := list 2 4 8 }}
{{- $classes = append $classes (dict "name" (printf "group-%d.gpu.metax-tech.com" $size) "cel" (printf "%s && %s == 'group' && device.attributes['gpu.metax-tech.com'].groupSize == %d" $driver $type $size)) }}
{{- end }}
{{- end }}
{{- range $classes }}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {{ .name }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  selectors:
    - cel:
        expression: {{ .cel | quote }}
  {{- if .extended }}
  extendedResourceName: metax-tech.com/gpu
  {{- end }}
{{- end }}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- include "gpuk8s.draClaimPolicy" . }}
{{- end }}
{{- end -}}

{{/*
The claims policy: a ResourceClaim or ResourceClaimTemplate that asks gpu-dra's classes for
something gpu-dra can never serve is refused when it is created, with the reason in our
words, instead of waiting as Pending with the scheduler's "cannot allocate all claims"
(docs/dra.md, "Claims gpu-dra refuses"). One policy per resource (a template's claim is
at .spec.spec). Each rule holds for every ask: a request's `exactly` and each of its
`firstAvailable`.
Context: root.
*/}}
{{- define "gpuk8s.draClaimPolicy" -}}
{{- $v := .Values.gpuDra -}}
{{- $ctx := dict "root" . "component" "gpu-dra" -}}
{{- $groups := eq (toString $v.groupDevices) "true" -}}
{{- $mine := "(%[1]s.deviceClassName == 'gpu.metax-tech.com' || %[1]s.deviceClassName.endsWith('.gpu.metax-tech.com'))" -}}
{{- $asks := "%[1]s.capacity.requests" -}}
{{- $has := "(has(%[1]s.capacity) && has(%[1]s.capacity.requests) && '%[2]s' in %[1]s.capacity.requests)" -}}
{{- $oneSided := "(!%[1]s || %[2]s == %[3]s)" -}}
{{- $vcore := "(!%[1]s || !%[2]s || !quantity(string(%[3]s['vcore'])).isGreaterThan(quantity('100')))" -}}
{{- $group := "(!%[1]s || !%[2]s.deviceClassName.startsWith('group-'))" -}}
{{- /* every ask of every request: its `exactly`, or each of its `firstAvailable` */ -}}
{{- $each := "variables.requests.all(r, (!has(r.exactly) || %[1]s) &&\n        (!has(r.firstAvailable) || r.firstAvailable.all(s, %[2]s)))" -}}
{{- $rules := dict -}}
{{- range $x := list "r.exactly" "s" }}
{{- $m := printf $mine $x }}
{{- $_ := set $rules (printf "oneSided-%s" $x) (printf $oneSided $m (printf $has $x "vcore") (printf $has $x "vmemory")) }}
{{- $_ := set $rules (printf "vcore-%s" $x) (printf $vcore $m (printf $has $x "vcore") (printf $asks $x)) }}
{{- $_ := set $rules (printf "group-%s" $x) (printf $group $m $x) }}
{{- end }}
{{- range $kind := list (dict "resource" "resourceclaims" "name" "dra-claims" "devices" "object.spec.devices" "has" "has(object.spec.devices)") (dict "resource" "resourceclaimtemplates" "name" "dra-claim-templates" "devices" "object.spec.spec.devices" "has" "has(object.spec.spec) && has(object.spec.spec.devices)") }}
{{- $name := include "gpuk8s.clusterName" (dict "root" $ "component" $kind.name) }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ $name }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["resource.k8s.io"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: [{{ $kind.resource | quote }}]
  variables:
    - name: requests
      expression: {{ printf "%s && has(%s.requests) ? %s.requests : []" $kind.has $kind.devices $kind.devices | quote }}
    # what each GPU request (the classes that select sGPU devices) takes of a GPU: its
    # capacity requests, or none (the whole GPU)
    - name: shares
      expression: >-
        variables.requests.filter(r, has(r.exactly) &&
        r.exactly.deviceClassName in ['gpu.metax-tech.com', 'sgpu.gpu.metax-tech.com']).map(r,
        has(r.exactly.capacity) && has(r.exactly.capacity.requests) ?
        r.exactly.capacity.requests : {})
    - name: linked
      expression: >-
        {{ printf "%s && has(%s.constraints)" $kind.has $kind.devices }} ? {{ $kind.devices }}.constraints.filter(c,
        has(c.matchAttribute) && c.matchAttribute == 'gpu.metax-tech.com/linkGroup') : []
  validations:
    - expression: >-
        {{ printf $each (get $rules "oneSided-r.exactly") (get $rules "oneSided-s") }}
      message: >-
        gpu-dra: a share names both vcore and vmemory, or neither (then it is the whole GPU):
        vcore alone takes all of the GPU's memory and vmemory alone all of its compute, so
        such shares would spread one per GPU; name both, e.g. vcore "25" with vmemory 16Gi
        for a quarter of a 64 GiB GPU (docs/dra.md)
      reason: Invalid
    - expression: >-
        {{ printf $each (get $rules "vcore-r.exactly") (get $rules "vcore-s") }}
      message: >-
        gpu-dra: vcore is a percent of one GPU, 1 to 100; a share larger than a GPU never
        fits (ask for more devices instead)
      reason: Invalid
    - expression: >-
        variables.shares.all(s, s == variables.shares[0])
      message: >-
        gpu-dra: the GPU requests of one claim must ask for the same share (the same vcore
        and vmemory, written the same way, or none: whole GPUs), as the container gets one
        sGPU limit; use one claim per share size
      reason: Invalid
    - expression: >-
        variables.linked.all(c, variables.requests.all(r, !has(r.exactly) ||
        !({{ printf $mine "r.exactly" }}) ||
        (has(c.requests) && size(c.requests) > 0 && !(r.name in c.requests)) ||
        !has(r.exactly.count) || r.exactly.count <= 8))
      message: >-
        gpu-dra: no MetaXLink or NVLink group has more than 8 GPUs, so a request for more
        than 8 with matchAttribute gpu.metax-tech.com/linkGroup can never be allocated
      reason: Invalid
    {{- if not $groups }}
    - expression: >-
        {{ printf $each (get $rules "group-r.exactly") (get $rules "group-s") }}
      message: >-
        gpu-dra: group devices are off on this cluster (gpuDra.groupDevices is not true:
        on Kubernetes 1.35 they slow kube-scheduler's DRA allocator 30-120 times; docs/dra.md,
        Flags); ask for count 2, 4 or 8 of gpu.metax-tech.com with matchAttribute
        gpu.metax-tech.com/linkGroup instead
      reason: Invalid
    {{- end }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
spec:
  policyName: {{ $name }}
  validationActions: [Deny]
{{- end }}
{{- end -}}
