{{/* The release's full name: the release name, with the chart's name added unless it has it. */}}
{{- define "promptbus.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The pods' selector; app.kubernetes.io/name is the ServiceMonitor's job label, which the
alert rules select (job="promptbus"), whatever the release is called. */}}
{{- define "promptbus.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "promptbus.labels" -}}
{{ include "promptbus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "promptbus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "promptbus.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Whether an object of a custom resource is rendered: its toggle (true, false, or auto: when
the cluster serves the resource). Call with (list $toggle $apiVersionKind $). */}}
{{- define "promptbus.enabled" -}}
{{- $toggle := index . 0 -}}
{{- if eq (toString $toggle) "auto" -}}
{{- if (index . 2).Capabilities.APIVersions.Has (index . 1) }}true{{ end -}}
{{- else if $toggle -}}
true
{{- end -}}
{{- end -}}

{{- define "promptbus.autoscaling" -}}
{{- include "promptbus.enabled" (list .Values.autoscaling.enabled "keda.sh/v1alpha1/ScaledObject" .) -}}
{{- end -}}

{{/* The tier file, as YAML: values.tiers (its lanes in laneOrder, as Helm keeps no order of
a mapping), else the chart's example. */}}
{{- define "promptbus.tierFile" -}}
{{- $tiers := .Values.tiers -}}
{{- if not $tiers -}}
{{- .Files.Get "files/tiers.example.yaml" -}}
{{- else -}}
{{- $lanes := $tiers.lanes | default dict -}}
{{- $order := .Values.laneOrder -}}
{{- if and (gt (len $lanes) 1) (ne (keys $lanes | sortAlpha | toJson) ($order | sortAlpha | toJson)) -}}
{{- fail (printf "laneOrder: %s must name the lanes %s, highest priority first (a lane's priority is its place in lanes, and Helm keeps no order of a mapping's keys)" ($order | toJson) (keys $lanes | sortAlpha | toJson)) -}}
{{- end -}}
{{- toYaml (omit $tiers "lanes") }}
{{- if $lanes }}
lanes:
{{- range $name := (gt (len $lanes) 1 | ternary $order (keys $lanes)) }}
  {{ $name | toJson }}: {{ get $lanes $name | toJson }}
{{- end }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* An environment value: a string as it is, anything else as JSON (a number keeps its digits). */}}
{{- define "promptbus.envValue" -}}
{{- if kindIs "string" . -}}{{ quote . }}{{- else -}}{{ toJson . | quote }}{{- end -}}
{{- end -}}

{{/* The container's environment: values.settings as PROMPTBUS_* (nested with __), the metrics
port, the CA file, and the keys of secretEnv that name one variable. */}}
{{- define "promptbus.env" -}}
{{- range $name, $value := .Values.settings }}
{{- if kindIs "map" $value }}
{{- range $sub, $v := $value }}
{{- if not (kindIs "invalid" $v) }}
- name: {{ printf "PROMPTBUS_%s__%s" $name $sub | upper }}
  value: {{ include "promptbus.envValue" $v }}
{{- end }}
{{- end }}
{{- else if not (kindIs "invalid" $value) }}
- name: {{ printf "PROMPTBUS_%s" $name | upper }}
  value: {{ include "promptbus.envValue" $value }}
{{- end }}
{{- end }}
- name: PROMPTBUS_METRICS_PORT
  value: {{ .Values.metrics.port | toJson | quote }}
{{- with .Values.kafkaCA.secretName }}
- name: PROMPTBUS_KAFKA__SSL_CAFILE
  value: {{ printf "/etc/promptbus/kafka-ca/%s" $.Values.kafkaCA.key | quote }}
{{- end }}
{{- range .Values.secretEnv }}
{{- if .key }}
- name: {{ .env }}
  valueFrom: {secretKeyRef: {name: {{ .secretName | toJson }}, key: {{ .key | toJson }}}}
{{- end }}
{{- end }}
{{- end -}}

{{- define "promptbus.envFrom" -}}
{{- range .Values.secretEnv }}
{{- if not .key }}
- secretRef: {name: {{ .secretName | toJson }}}
{{- end }}
{{- end }}
{{- end -}}

{{/* terminationGracePeriodSeconds: the preStop sleep, then SIGTERM's bounded drain
(shutdown_timeout_s), its final flush (at most min(shutdown_timeout_s, 10)), the revoke when
leaving the group (revoke_timeout_s), and a margin: the kubelet kills nothing mid-commit. */}}
{{- define "promptbus.gracePeriod" -}}
{{- $shutdown := ceil .Values.settings.shutdown_timeout_s | int -}}
{{- $revoke := ceil .Values.settings.revoke_timeout_s | int -}}
{{- add .Values.preStopSleepSeconds $shutdown (min $shutdown 10) $revoke .Values.terminationMarginSeconds -}}
{{- end -}}
