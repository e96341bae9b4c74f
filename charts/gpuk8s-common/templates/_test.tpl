{{/*
`helm test RELEASE -n NAMESPACE --logs`: a pod (gpu-label image, the kubernetes client
it ships) that checks, on every node labelled metax-tech.com/gpu.installed=true:
the labels of SPEC §4 are there, the readiness labels the chart gates on are "true",
and metax-tech.com/gpu is allocatable; with gpu-aware deployed, that its Service answers.
Its ServiceAccount and read-only RBAC are test hooks too. Everything is deleted after the
test, passed or failed (nothing is left behind for `helm uninstall`, which never deletes
hooks); helm prints the pod's log either way (hook-output-log-policy), and `--logs` still
works (helm reads the logs before it deletes the hooks).
Context: root, readyLabels (list of readiness label suffixes the chart gates on).
*/}}
{{- define "gpuk8s.test" -}}
{{- $root := .root -}}
{{- $ctx := dict "root" $root "component" "gpu-test" "values" dict -}}
{{- $image := include "gpuk8s.image" (dict "root" $root "component" "gpu-label" "values" $root.Values.gpuLabel) -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: gpu-test
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-weight: "-10"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded,hook-failed
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-weight: "-10"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded,hook-failed
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ include "gpuk8s.clusterName" $ctx }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-weight: "-5"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded,hook-failed
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ include "gpuk8s.clusterName" $ctx }}
subjects:
  - kind: ServiceAccount
    name: gpu-test
    namespace: {{ $root.Release.Namespace }}
---
apiVersion: v1
kind: Pod
metadata:
  name: {{ printf "%s-gpu-test" $root.Release.Name | trunc 63 | trimSuffix "-" }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-weight: "0"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded,hook-failed
    helm.sh/hook-output-log-policy: hook-succeeded,hook-failed
spec:
  serviceAccountName: gpu-test
  restartPolicy: Never
  {{- with include "gpuk8s.imagePullSecrets" $root | trim }}{{ . | nindent 2 }}{{ end }}
  nodeSelector:
    kubernetes.io/os: linux
  tolerations:
    {{- include "gpuk8s.controlPlaneTolerations" $root | nindent 4 }}
  securityContext:
    {{- include "gpuk8s.podSecurityContext" $root | nindent 4 }}
  containers:
    - name: check
      image: {{ $image | quote }}
      imagePullPolicy: {{ $root.Values.pullPolicy | quote }}
      securityContext:
        {{- include "gpuk8s.restrictedSecurityContext" (dict "uid" 65532) | nindent 8 }}
      env:
        - name: READY_LABELS
          value: {{ join "," .readyLabels | quote }}
        - name: EXTENDER_URL
          # its health port: the extender port admits only kube-scheduler (TLS, NetworkPolicy)
          value: {{ if $root.Values.deployExtenderGPUAware }}{{ printf "gpu-aware.%s.svc:%v" $root.Release.Namespace $root.Values.gpuAware.healthPort | quote }}{{ else }}""{{ end }}
      command: ["python3", "-c"]
      args:
        - |
          import os, socket, sys
          from kubernetes import client, config
          P = "metax-tech.com/"
          SPEC_LABELS = ["driver.ready", "gpu.driver.mode", "gpu.product", "gpu.vfnum"]
          ready = [k for k in os.environ["READY_LABELS"].split(",") if k]
          config.load_incluster_config()
          nodes = client.CoreV1Api().list_node(label_selector=P + "gpu.installed=true").items
          problems = []
          if not nodes:
              problems.append("no node is labelled metax-tech.com/gpu.installed=true: is gpu-label running?")
          for node in nodes:
              name, labels = node.metadata.name, node.metadata.labels or {}
              gpus = int((node.status.allocatable or {}).get(P + "gpu", "0"))
              print(f"{name}: allocatable {P}gpu={gpus}; " + ", ".join(
                  f"{k[len(P):]}={v}" for k, v in sorted(labels.items()) if k.startswith(P)))
              missing = [k for k in SPEC_LABELS if P + k not in labels]
              if missing:
                  problems.append(f"{name}: labels missing: {', '.join(missing)}")
              not_ready = [k for k in ready if labels.get(P + k) != "true"]
              if not_ready:
                  problems.append(f"{name}: not ready: {', '.join(not_ready)}")
              elif gpus < 1:
                  problems.append(f"{name}: ready but no allocatable {P}gpu: is gpu-device running?")
          url = os.environ.get("EXTENDER_URL")
          if url:
              # the Service's address from the kubelet's environment (no cluster DNS
              # needed), else its DNS name
              host, port = url.rsplit(":", 1)
              host = os.environ.get("GPU_AWARE_SERVICE_HOST", host)
              try:
                  socket.create_connection((host, int(port)), timeout=5).close()
                  print(f"gpu-aware answers on {url}")
              except OSError as err:
                  problems.append(f"gpu-aware Service {url} does not answer: {err}")
          for problem in problems:
              print("FAIL", problem)
          sys.exit(1 if problems else 0)
{{- end -}}
