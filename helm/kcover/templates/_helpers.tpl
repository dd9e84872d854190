{{/* Names */}}
{{- define "kcover.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kcover.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
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

{{/* Labels */}}
{{- define "kcover.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kcover.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
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

{{/* image: repository@digest or repository:tag (tag defaults to appVersion) */}}
{{- define "kcover.image" -}}
{{- $img := index .root.Values.image .role -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository ($img.tag | default .root.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
kcover's config.yaml: .Values.config, with .Values.detectors merged into detectors.entries,
dryRun into recovery.dry_run and agent.dcgmExporterUrl into the dcgm detector's exporter_url.
Namespaces, names, ports and paths the chart depends on are set by environment variables instead
(they win over the file), so a config edit cannot move them away from what RBAC and probes expect.
*/}}
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
{{- $agent := dict -}}
{{- if hasKey $cfg "agent" }}{{ $agent = index $cfg "agent" }}{{ end -}}
{{- $av := dict -}}
{{- if hasKey $agent "validation" }}{{ $av = index $agent "validation" }}{{ end -}}
{{- $_ := set $av "enabled" true -}}
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
