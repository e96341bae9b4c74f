{{/*
NOTES.txt of both charts: what was installed and how to verify it.
Context: root, gating (text: the labels gpu-device waits for), operator (bool).
*/}}
{{- define "gpuk8s.notes" -}}
{{- $root := .root -}}
{{- $ns := $root.Release.Namespace -}}
{{- $images := list "gpu-device" "gpu-label" -}}
{{- if $root.Values.deployExtenderGPUAware }}{{ $images = append $images "gpu-aware" }}{{ end -}}
{{- if .operator }}{{ $images = concat $images (list "driver-manager" "container-runtime" "operator-controller") }}{{ end -}}
{{ $root.Chart.Name }} {{ $root.Chart.AppVersion }} is installed in namespace {{ $ns }} (release {{ $root.Release.Name }}).
Images: {{ trimSuffix "/" $root.Values.registry }}/{ {{- join "," $images -}} } (pull policy {{ $root.Values.pullPolicy }}).

Verify:
  # the components run; gpu-device only on nodes labelled {{ .gating }}
  kubectl get daemonsets,deployments,pods -n {{ $ns }} -o wide

  # every GPU node is labelled (metax-tech.com/...) and offers metax-tech.com/gpu
  kubectl get nodes -L metax-tech.com/gpu.installed,metax-tech.com/driver.ready,metax-tech.com/gpu.product,metax-tech.com/gpu.vfnum
  kubectl describe nodes | grep -E '^Name:|metax-tech.com/gpu:'

  # the chart's own check of labels and allocatable GPUs
  helm test {{ $root.Release.Name }} -n {{ $ns }} --logs
{{- if .operator }}

The operator installs the driver and the SDK first: follow the readiness labels with
  kubectl get nodes -L metax-tech.com/driver.ready,metax-tech.com/maca.ready,metax-tech.com/runtime.ready
VF counts per node: kubectl edit configmap driver-config -n {{ $ns }}   (key node-vfnums)
{{- end }}
{{- if $root.Values.deployExtenderGPUAware }}

gpu-aware is deployed; kube-scheduler must be configured to call it (SPEC §7):
  kubectl get service gpu-aware -n {{ $ns }} -o jsonpath='{.spec.clusterIP}'
  # -> urlPrefix http://<that IP>:8080 in /etc/metax/extender.yaml on every control-plane node
  # weights: kubectl edit configmap gpu-aware -n {{ $ns }}
{{- end }}

Uninstall{{ if .operator }} (--wait is mandatory: it lets everything the operator deployed go){{ end }}:
  helm uninstall {{ $root.Release.Name }} -n {{ $ns }} --wait
{{- end -}}
