{{/*
Cross-field rules that values.schema.json cannot express. Each `fail` names the
option(s) and says what to do. Types, enums and patterns live in values.schema.json.
Context: root.
*/}}
{{- define "gpuk8s.validations" -}}
{{- $v := .Values -}}
{{- if not (trimSuffix "/" (toString $v.registry)) -}}
{{- fail "registry: must name the registry holding the component images, as DOMAIN/PROJECT (e.g. --set registry=harbor.example.com/metax)" -}}
{{- end -}}
{{- if and $v.deployExtenderGPUAware (eq (float64 $v.gpuAware.scoreWeight) 0.0) (eq (float64 $v.gpuAware.lossWeight) 0.0) -}}
{{- fail "gpuAware.scoreWeight and gpuAware.lossWeight are both 0: every node would get the same priority and gpu-aware would have no effect; set at least one of them above 0" -}}
{{- end -}}
{{- /* A log dir is mounted read-write from the node: never the host's / or a system
directory (whose files the components could then overwrite). */ -}}
{{- $system := list "/" "/bin" "/boot" "/dev" "/etc" "/lib" "/lib64" "/proc" "/root" "/run" "/sbin" "/sys" "/usr" "/var" -}}
{{- $dirs := dict "log" (($v.log | default dict).dir | default "" | toString) -}}
{{- range $component := list "gpuDevice" "gpuLabel" "gpuAware" "gpuExporter" "driver" "maca" "runtime" "operatorController" -}}
{{- $log := (get $v $component | default dict).log | default dict -}}
{{- if and (hasKey $log "dir") (get $log "dir") (not (hasPrefix "/" (toString (get $log "dir")))) -}}
{{- fail (printf "%s.log.dir: %q must be an absolute path on the node (or \"\" to log to stderr only)" $component (get $log "dir")) -}}
{{- end -}}
{{- if hasKey $log "dir" }}{{ $_ := set $dirs (printf "%s.log" $component) (toString (get $log "dir")) }}{{ end -}}
{{- end -}}
{{- range $key, $dir := $dirs -}}
{{- if and $dir (has (clean $dir) $system) -}}
{{- fail (printf "%s.dir: %q is a system directory of the node, mounted read-write for the log files; use a directory of its own such as /var/log/metax (or \"\" to log to stderr only)" $key $dir) -}}
{{- end -}}
{{- end -}}
{{- end -}}
