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

