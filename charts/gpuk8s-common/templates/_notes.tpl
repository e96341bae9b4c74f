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
{{- $tls := $root.Values.gpuAware.tls.enabled }}

gpu-aware is deployed; kube-scheduler must be configured to call it (SPEC §7, docs/extender.md):
  ansible-playbook -i <inventory> playbooks/gpu_aware.yml{{ if not $tls }} -e gpu_aware_tls=false{{ end }}
  # or by hand: kubectl get service gpu-aware -n {{ $ns }} -o jsonpath='{.spec.clusterIP}'
{{- if $tls }}
  # -> urlPrefix https://<that IP>:8080, enableHTTPS: true, tlsConfig {serverName:
  #    gpu-aware.{{ $ns }}.svc, caFile, certFile, keyFile} from Secret gpu-aware-scheduler-client
  #    (ca.crt, tls.crt, tls.key) in /etc/metax/extender.yaml on every control-plane node.
  # Certificates are renewed by a `helm upgrade` within {{ $root.Values.gpuAware.tls.renewBeforeDays }} days of their expiry;
  # run playbooks/gpu_aware.yml after it (kube-scheduler reads its files only at start).
{{- else }}
  # -> urlPrefix http://<that IP>:8080 in /etc/metax/extender.yaml on every control-plane node
  #    (gpuAware.tls.enabled=false: plain HTTP, any client that reaches the port may call it)
{{- end }}
  # weights: kubectl edit configmap gpu-aware-plugin -n {{ $ns }}
{{- range (include "gpuk8s.gpuAwareWeights" $root | fromYaml).notes }}
  # {{ . }}
{{- end }}
{{- if not $root.Values.gpuAware.networkPolicy.enabled }}
  # WARNING: no NetworkPolicy for gpu-aware (gpuAware.networkPolicy.enabled=false): any pod
  # that reaches port 8080 may try it; client certificates are its only guard
{{- end }}
{{- end }}

Uninstall{{ if .operator }} (--wait is mandatory: it lets everything the operator deployed go){{ end }}:
  helm uninstall {{ $root.Release.Name }} -n {{ $ns }} --wait
{{- end -}}
