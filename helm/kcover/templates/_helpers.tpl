{{/* Names: nameOverride replaces the chart's name (the app.kubernetes.io/name label and the default
prefix of every object), fullnameOverride the prefix itself. Truncated to 50 so that "-controller-metrics"
still fits the 63 characters of a Service name. */}}
{{- define "kcover.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kcover.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "kcover.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kcover.controller.fullname" -}}{{ include "kcover.fullname" . }}-controller{{- end -}}
{{- define "kcover.agent.fullname" -}}{{ include "kcover.fullname" . }}-agent{{- end -}}
{{- define "kcover.config.name" -}}{{ include "kcover.fullname" . }}-config{{- end -}}
{{- define "kcover.logs.claim" -}}
{{- .Values.controller.logs.persistence.existingClaim | default (printf "%s-logs" (include "kcover.fullname" .)) -}}
{{- end -}}

{{- define "kcover.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- .Values.controller.serviceAccount.name | default (include "kcover.controller.fullname" .) -}}
{{- else -}}
{{- .Values.controller.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "kcover.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- .Values.agent.serviceAccount.name | default (include "kcover.agent.fullname" .) -}}
{{- else -}}
{{- .Values.agent.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* Labels: the chart's own, then commonLabels (on every object and pod). The chart's cannot be overridden:
selectors, the event watcher's trust in agent pods and the ServiceMonitor depend on them. */}}
{{- define "kcover.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kcover.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{- range $key, $_ := . }}
{{- if or (hasPrefix "app.kubernetes.io/" $key) (eq $key "helm.sh/chart") }}
{{- fail (printf "commonLabels.%s: the chart sets the app.kubernetes.io/* and helm.sh/chart labels itself (selectors depend on them); use another key" $key) }}
{{- end }}
{{- end }}
{{ include "kcover.stringMap" . }}
{{- end }}
{{- end -}}

{{/* A map of labels, annotations or a nodeSelector with every value a string: `--set agent.nodeSelector.gpu=true`
gives the boolean true, which Kubernetes refuses in a map of strings. Null values (a key dropped with
`--set x.key=null`) are left out. */}}
{{- define "kcover.stringMap" -}}
{{- $out := dict -}}
{{- range $key, $value := . }}
{{- if not (kindIs "invalid" $value) }}
{{- $_ := set $out $key (toString $value) -}}
{{- end }}
{{- end -}}
{{- if $out }}{{ toYaml $out }}{{ end -}}
{{- end -}}

{{/* A pod's labels: the chart's, then `podLabels` (which may not override the chart's). */}}
{{- define "kcover.podLabels" -}}
{{- range $key, $_ := .podLabels }}
{{- if hasPrefix "app.kubernetes.io/" $key }}
{{- fail (printf "%s.podLabels.%s: the chart sets the app.kubernetes.io/* labels itself (selectors depend on them); use another key" $.role $key) }}
{{- end }}
{{- end }}
{{- with .podLabels }}
{{ include "kcover.stringMap" . }}
{{- end }}
{{- end -}}

{{/* Extra volumes beside the chart's own, refused when a name is one the chart uses. */}}
{{- define "kcover.extraVolumes" -}}
{{- $own := .own -}}
{{- range .volumes }}
{{- if has .name $own }}
{{- fail (printf "%s.extraVolumes: %q is a volume of the chart (%s); choose another name" $.role .name (join ", " $own)) }}
{{- end }}
{{- end }}
{{- with .volumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A Kubernetes quantity ("1Gi", "500M", "1.5Gi", "1073741824") in bytes. */}}
{{- define "kcover.bytes" -}}
{{- $q := toString .quantity -}}
{{- $num := regexFind "^[0-9]+([.][0-9]+)?" $q -}}
{{- $suffix := trimPrefix $num $q -}}
{{- $mult := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- if or (not $num) (not (hasKey $mult $suffix)) -}}
{{- fail (printf "%s: %q is not a size (a Kubernetes quantity such as 5Gi or 500Mi)" .what $q) -}}
{{- end -}}
{{- mulf (float64 $num) (index $mult $suffix) | int64 -}}
{{- end -}}

{{/*
The saved-logs volume and the retention, reconciled: the controller keeps at most
config.recovery.save_logs.retention_bytes in the volume, so a volume smaller than that fills up and the
kubelet evicts the pod (an emptyDir past its sizeLimit) or writes fail (a full PVC). Unset, the retention is
80% of the volume (the rest: one save in progress, up to save_logs.max_bytes_per_container per container,
before retention prunes); set, it must fit the volume. Prints the retention in bytes, or nothing when logs
are not saved.
*/}}
{{- define "kcover.logsRetention" -}}
{{- $rec := (.Values.config | default dict).recovery | default dict -}}
{{- $save := $rec.save_logs | default dict -}}
{{- if not (and (hasKey $save "enabled") (not $save.enabled)) -}}
{{- $p := .Values.controller.logs.persistence -}}
{{- $what := ternary "controller.logs.persistence.size" "controller.logs.emptyDirSizeLimit" $p.enabled -}}
{{- $size := ternary $p.size .Values.controller.logs.emptyDirSizeLimit $p.enabled -}}
{{- $volume := include "kcover.bytes" (dict "quantity" $size "what" $what) | int64 -}}
{{- if hasKey $save "retention_bytes" -}}
{{- if not (or (kindIs "int64" $save.retention_bytes) (kindIs "int" $save.retention_bytes) (kindIs "float64" $save.retention_bytes)) -}}
{{- fail (printf "config.recovery.save_logs.retention_bytes must be a number of bytes, not %q (a quantity such as 5Gi belongs in controller.logs.*)" (toString $save.retention_bytes)) -}}
{{- end -}}
{{- if gt (int64 $save.retention_bytes) $volume -}}
{{- fail (printf "config.recovery.save_logs.retention_bytes (%d) is larger than the saved-logs volume (%s: %s, %d bytes): the controller would fill it and be evicted mid-recovery. Raise %s or lower the retention (or leave it unset: 80%% of the volume)" (int64 $save.retention_bytes) $what $size $volume $what) -}}
{{- end -}}
{{- else -}}
{{- div (mul $volume 4) 5 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kcover.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kcover.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kcover.controller.selectorLabels" -}}
{{ include "kcover.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "kcover.agent.selectorLabels" -}}
{{ include "kcover.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end -}}

{{/*
image: <registry>/<repository>@<digest>, or <registry>/<repository>:<tag> (tag defaults to appVersion).
image.registry has no default (this project publishes no images): without it the chart refuses to render
and says how to build and push them.
*/}}
{{- define "kcover.image" -}}
{{- $registry := .root.Values.image.registry | default "" | trimSuffix "/" -}}
{{- if not $registry -}}
{{- fail "image.registry is not set, and kcover publishes no images: build both images and push them to your registry with `scripts/build-images --push REGISTRY` (from a clone of kcover; see docs/install.md, \"Images\"), then install with `--set image.registry=REGISTRY`. Images built on the nodes and loaded into their container runtime: `--set image.registry=localhost`." -}}
{{- end -}}
{{- $img := index .root.Values.image .role -}}
{{- if $img.digest -}}
{{- printf "%s/%s@%s" $registry $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s/%s:%s" $registry $img.repository ($img.tag | default .root.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
A CRD from files/, annotated `helm.sh/resource-policy: keep`: `helm uninstall` leaves it, and with it every
object of its kind (the Recovery history, the ledger's budgets, cooldowns and pending intents, the
preflight reports). docs/install.md ("Uninstall") says how to delete them on purpose.
*/}}
{{- define "kcover.keptCRD" -}}
{{- $crd := .root.Files.Get .file | fromYaml -}}
{{- if hasKey $crd "Error" -}}
{{- fail (printf "%s: %s" .file $crd.Error) -}}
{{- end -}}
{{- $meta := $crd.metadata -}}
{{- $_ := set $meta "annotations" (merge (dict "helm.sh/resource-policy" "keep") ($meta.annotations | default dict)) -}}
{{- toYaml $crd -}}
{{- end -}}

{{/*
kcover's config.yaml: .Values.config, with .Values.detectors merged into detectors.entries,
dryRun into recovery.dry_run, agent.dcgmExporterUrl into the dcgm detector's exporter_url, and (with
nameOverride) the agent pods' labels into the event watcher's agent_pod_labels.
Namespaces, names, ports and paths the chart depends on are set by environment variables instead
(they win over the file), so a config edit cannot move them away from what RBAC and probes expect.
*/}}
{{/* Whether the agents answer validation requests: agentValidation.enabled, or returnValidation.enabled. */}}
{{- define "kcover.agentValidates" -}}
{{- if or (.Values.agentValidation | default dict).enabled (.Values.returnValidation | default dict).enabled -}}true{{- end -}}
{{- end -}}

{{- define "kcover.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- if .Values.dryRun -}}
{{- $rec := dict -}}
{{- if hasKey $cfg "recovery" }}{{ $rec = index $cfg "recovery" }}{{ end -}}
{{- $_ := set $rec "dry_run" true -}}
{{- $_ := set $cfg "recovery" $rec -}}
{{- end -}}
{{- if (.Values.returnValidation | default dict).enabled -}}
{{- $rec := dict -}}
{{- if hasKey $cfg "recovery" }}{{ $rec = index $cfg "recovery" }}{{ end -}}
{{- $rv := dict -}}
{{- if hasKey $rec "return_validation" }}{{ $rv = index $rec "return_validation" }}{{ end -}}
{{- $_ := set $rv "enabled" true -}}
{{- $_ := set $rv "diag_level" (.Values.returnValidation.diagLevel | default 1) -}}
{{- $_ := set $rec "return_validation" $rv -}}
{{- $_ := set $cfg "recovery" $rec -}}
{{- end -}}
{{- if not (include "kcover.agentValidates" .) -}}
{{- $agent := dict -}}
{{- if hasKey $cfg "agent" }}{{ $agent = index $cfg "agent" }}{{ end -}}
{{- $av := dict -}}
{{- if hasKey $agent "validation" }}{{ $av = index $agent "validation" }}{{ end -}}
{{- $_ := set $av "enabled" false -}}
{{- $_ := set $agent "validation" $av -}}
{{- $_ := set $cfg "agent" $agent -}}
{{- end -}}
{{- $wanted := deepCopy (.Values.detectors | default dict) -}}
{{- if .Values.preflight.enabled -}}
{{- $judge := dict "isolated" false "config" (dict "collection_timeout_seconds" .Values.preflight.collectionTimeoutSeconds) -}}
{{- $collector := dict "isolated" false "config" (dict "report_dir" .Values.preflight.hostPath) -}}
{{- $_ := set $wanted "preflight" (mergeOverwrite $judge (index $wanted "preflight" | default dict)) -}}
{{- $_ := set $wanted "preflight-collector" (mergeOverwrite $collector (index $wanted "preflight-collector" | default dict)) -}}
{{- if .Values.preflight.cordon -}}
{{- $rec := dict -}}
{{- if hasKey $cfg "recovery" }}{{ $rec = index $cfg "recovery" }}{{ end -}}
{{- $rules := list -}}
{{- if hasKey $rec "rules" }}{{ $rules = index $rec "rules" }}{{ end -}}
{{- $_ := set $rec "rules" (append $rules (dict "detector" "preflight" "target" "Node" "action" "cordon-node-and-restart")) -}}
{{- $_ := set $cfg "recovery" $rec -}}
{{- end -}}
{{- end -}}
{{- $name := include "kcover.name" . -}}
{{- if ne $name "kcover" -}}
{{- /* the event watcher trusts a Node Event only beside an agent pod carrying the chart's labels */ -}}
{{- $given := dict -}}
{{- range (list (index $wanted "event-watcher" | default dict) (index ((index $cfg "detectors" | default dict).entries | default dict) "event-watcher" | default dict)) -}}
{{- if hasKey (.config | default dict) "agent_pod_labels" }}{{ $_ := set $given "set" true }}{{ end -}}
{{- end -}}
{{- if not $given.set -}}
{{- $watcher := index $wanted "event-watcher" | default dict -}}
{{- $watcherCfg := $watcher.config | default dict -}}
{{- $_ := set $watcherCfg "agent_pod_labels" (dict "app.kubernetes.io/name" $name "app.kubernetes.io/component" "agent") -}}
{{- $_ := set $watcher "config" $watcherCfg -}}
{{- $_ := set $wanted "event-watcher" $watcher -}}
{{- end -}}
{{- end -}}
{{- if .Values.agent.dcgmExporterUrl -}}
{{- $dcgm := dict -}}
{{- if hasKey $wanted "dcgm" }}{{ $dcgm = index $wanted "dcgm" }}{{ end -}}
{{- $dcgmCfg := dict -}}
{{- if hasKey $dcgm "config" }}{{ $dcgmCfg = index $dcgm "config" }}{{ end -}}
{{- $_ := set $dcgmCfg "exporter_url" .Values.agent.dcgmExporterUrl -}}
{{- $_ := set $dcgm "config" $dcgmCfg -}}
{{- $_ := set $wanted "dcgm" $dcgm -}}
{{- end -}}
{{- if $wanted -}}
{{- $det := dict -}}
{{- if hasKey $cfg "detectors" }}{{ $det = index $cfg "detectors" }}{{ end -}}
{{- $entries := dict -}}
{{- if hasKey $det "entries" }}{{ $entries = index $det "entries" }}{{ end -}}
{{- range $name, $entry := $wanted -}}
{{- $merged := dict -}}
{{- if hasKey $entries $name }}{{ $merged = index $entries $name }}{{ end -}}
{{- $_ := set $entries $name (mergeOverwrite $merged ($entry | default dict)) -}}
{{- end -}}
{{- $_ := set $det "entries" $entries -}}
{{- $_ := set $cfg "detectors" $det -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Environment both roles share. */}}
{{- define "kcover.commonEnv" -}}
- name: KCOVER_SERVER__PORT
  value: {{ .Values.metrics.port | quote }}
- name: KCOVER_LOGGING__FORMAT
  value: json
{{- end -}}

{{- define "kcover.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  initialDelaySeconds: {{ .probes.livenessProbe.initialDelaySeconds }}
  periodSeconds: {{ .probes.livenessProbe.periodSeconds }}
  timeoutSeconds: {{ .probes.livenessProbe.timeoutSeconds }}
  failureThreshold: {{ .probes.livenessProbe.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  initialDelaySeconds: {{ .probes.readinessProbe.initialDelaySeconds }}
  periodSeconds: {{ .probes.readinessProbe.periodSeconds }}
  timeoutSeconds: {{ .probes.readinessProbe.timeoutSeconds }}
  failureThreshold: {{ .probes.readinessProbe.failureThreshold }}
{{- end -}}
