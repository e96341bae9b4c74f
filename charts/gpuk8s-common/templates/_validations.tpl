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
{{- range $component := list "gpuDevice" "gpuDra" "gpuLabel" "gpuAware" "gpuExporter" "driver" "maca" "runtime" "operatorController" -}}
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
{{- /* Container resources as the apiserver checks them (the schema checks each quantity):
requests at most the limits; a resource that cannot be overcommitted (hugepages-*, an
extended resource domain/name) requested only with an equal limit. */ -}}
{{- range $component, $values := $v -}}
{{- $resources := (kindIs "map" $values | ternary $values dict).resources | default dict -}}
{{- $requests := $resources.requests | default dict -}}
{{- $limits := $resources.limits | default dict -}}
{{- range $name, $request := $requests -}}
{{- $exact := or (hasPrefix "hugepages-" $name) (contains "/" $name) -}}
{{- if hasKey $limits $name -}}
{{- $req := include "gpuk8s.quantity" $request | float64 -}}
{{- $lim := include "gpuk8s.quantity" (get $limits $name) | float64 -}}
{{- $slack := mulf (max $req $lim) 1e-9 -}}{{- /* float rounding: 300m is 0.30000000000000004 */ -}}
{{- if and $exact (gt (subf (max $req $lim) (min $req $lim)) $slack) -}}
{{- fail (printf "%s.resources.requests.%s (%v) must equal %s.resources.limits.%s (%v): Kubernetes does not overcommit %s" $component $name $request $component $name (get $limits $name) $name) -}}
{{- else if gt $req (addf $lim $slack) -}}
{{- fail (printf "%s.resources.requests.%s (%v) exceeds %s.resources.limits.%s (%v): Kubernetes refuses the pod; raise the limit or lower the request (--set %s.resources.requests.%s=...)" $component $name $request $component $name (get $limits $name) $component $name) -}}
{{- end -}}
{{- else if $exact -}}
{{- fail (printf "%s.resources.requests.%s needs %s.resources.limits.%s too, equal to it: Kubernetes does not overcommit %s" $component $name $component $name $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The value of a Kubernetes quantity (its syntax checked by the schema: a number, then a
binary-SI or decimal-SI suffix or a decimal exponent), as a float. Context: the quantity.
*/}}
{{- define "gpuk8s.quantity" -}}
{{- $q := trimPrefix "+" (toString .) -}}
{{- $number := regexFind "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" $q | default "0" -}}
{{- $suffix := trimPrefix $number $q -}}
{{- $factors := dict "" 1.0 "n" 1e-9 "u" 1e-6 "m" 1e-3 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $value := float64 $number -}}
{{- if hasKey $factors $suffix -}}
{{- $value = mulf $value (get $factors $suffix) -}}
{{- else -}}
{{- $exponent := lower $suffix | trimPrefix "e" -}}{{- /* e3, E-2, e+09 (a float's toString) */ -}}
{{- range until (atoi (trimPrefix "-" (trimPrefix "+" $exponent))) -}}
{{- $value = ternary (divf $value 10.0) (mulf $value 10.0) (hasPrefix "-" $exponent) -}}
{{- end -}}
{{- end -}}
{{- $value -}}
{{- end -}}

{{/*
No two volumeMounts of one container at one path: Kubernetes refuses such a pod (a
mountPath must be unique) and a container runtime refuses two paths equal but for a
trailing "/"; a log dir, an extra read path or a runtime directory from the values can
land where the chart already mounts something (gpuDevice.log.dir at the kubelet's
device-plugins directory). Renders each of the chart's templates with pods and checks
every container; the message names the value(s) that set the paths.
Context: root, files (the chart's templates with pods, relative to templates/).
*/}}
{{- define "gpuk8s.checkMounts" -}}
{{- $root := .root -}}
{{- $keys := dict "gpu-device" "gpuDevice" "gpu-dra" "gpuDra" "gpu-label" "gpuLabel" "gpu-aware" "gpuAware" "gpu-exporter" "gpuExporter" "gpu-mps" "gpuMps" "container-runtime" "runtime" "operator-controller" "operatorController" -}}
{{- range $file := .files -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" (include (printf "%s/%s" $root.Template.BasePath $file) $root) -1 -}}
{{- $obj := fromYaml $doc | default dict -}}
{{- $spec := dict -}}
{{- if eq (toString $obj.kind) "Pod" -}}
{{- $spec = $obj.spec | default dict -}}
{{- else if (($obj.spec | default dict).template | default dict).spec -}}
{{- $spec = $obj.spec.template.spec -}}
{{- end -}}
{{- range $c := concat ($spec.initContainers | default list) ($spec.containers | default list) -}}
{{- $seen := dict -}}
{{- range $m := $c.volumeMounts | default list -}}
{{- $path := clean (toString $m.mountPath) -}}
{{- if hasKey $seen $path -}}
{{- $volumes := list (get $seen $path) $m.name -}}
{{- $fields := list -}}
{{- range $volume := $volumes -}}
{{- if or (eq $volume "log") (hasPrefix "log-" $volume) -}}
{{- $key := ternary (trimPrefix "log-" $volume) (get $keys $c.name | default $c.name) (hasPrefix "log-" $volume) -}}
{{- $fields = append $fields (printf "%s.log.dir (or the global log.dir)" $key) -}}
{{- else if hasPrefix "host-extra-" $volume -}}
{{- $fields = append $fields (printf "hostPaths.extraReadPaths[%s]" (trimPrefix "host-extra-" $volume)) -}}
{{- else if eq $volume "containerd-config" -}}
{{- $fields = append $fields "runtime.containerd.config (its directory)" -}}
{{- else if eq $volume "install" -}}
{{- $fields = append $fields "runtime.installDir" -}}
{{- end -}}
{{- end -}}
{{- fail (printf "%s %s, container %s: volumes %q and %q are both mounted at %s, and Kubernetes refuses two mounts at one path: set %s to a path of its own" (toString $obj.kind) (toString $obj.metadata.name) (toString $c.name) (index $volumes 0) (index $volumes 1) $path (join " or " $fields | default "the values that set these paths")) -}}
{{- end -}}
{{- $_ := set $seen $path $m.name -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
