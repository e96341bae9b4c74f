{{/*
Custom resource descriptors (SPEC §11, §13): one ConfigMap cf-crl-<customName>-<keyName>
per entry of resourceDescriptors.items, in resourceDescriptors.namespace (kube-public),
with the labels and data keys a container platform reads to offer the resource in its
forms. Context: root.
*/}}
{{- define "gpuk8s.resourceDescriptors" -}}
{{- $root := .root -}}
{{- $v := $root.Values.resourceDescriptors -}}
{{- $ctx := dict "root" $root "component" "resource-descriptors" "values" dict -}}
{{- range $i, $item := $v.items }}
{{- if $i }}
---
{{- end }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ printf "cf-crl-%s-%s" $item.customName $item.keyName | quote }}
  namespace: {{ $v.namespace | quote }}
  labels:
    {{- include "gpuk8s.labels" $ctx | nindent 4 }}
    features.alauda.io/type: CustomResourceLimitation
    features.alauda.io/group: {{ $item.customName | quote }}
    features.alauda.io/enabled: "true"
data:
  key: {{ $item.key | quote }}
  dataType: {{ $item.dataType | quote }}
  defaultValue: {{ $item.defaultValue | toString | quote }}
  descriptionZh: {{ $item.descriptionZh | quote }}
  descriptionEn: {{ $item.descriptionEn | quote }}
  group: {{ $item.customName | quote }}
  limits: {{ $item.limits | quote }}
  requests: {{ $item.requests | quote }}
{{- end }}
{{- end -}}
