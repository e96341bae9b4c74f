{{/*
Helpers of the operator chart only.

Security context of driver-manager's payload containers: they copy the files of their
image as they are (cp -a keeps owners and modes), as root with only the capabilities that
needs.
*/}}
{{- define "gpuk8s.payloadSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsUser: 0
capabilities:
  drop: ["ALL"]
  add: ["CHOWN", "FOWNER", "DAC_OVERRIDE"]
{{- end -}}


{{/*
The release's nodeSelector as a label selector (key=value,... sorted by key; empty: every
node): operator-controller and its uninstall hook act on those nodes only, so a release
confined to a node group (another scheme's release beside it) leaves the other nodes alone.
*/}}
{{- define "gpuk8s.operatorNodeSelector" -}}
{{- $terms := list -}}
{{- range $key, $value := .Values.nodeSelector | default dict -}}
{{- $terms = append $terms (printf "%s=%s" $key (toString $value)) -}}
{{- end -}}
{{- join "," $terms -}}
{{- end -}}
