{{- define "outboxd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "outboxd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "outboxd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outboxd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "outboxd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "outboxd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
outboxd.io/slot: {{ include "outboxd.slot" . | quote }}
{{- end }}

{{- define "outboxd.slot" -}}
{{- $pg := .Values.config.postgres | default dict }}
{{- $pg.slot | default "outboxd" }}
{{- end }}

{{/* The metrics port: the port of config.metrics.listen. */}}
{{- define "outboxd.metricsPort" -}}
{{- $listen := required "config.metrics.listen is required: the probes and the Service use it (e.g. \"0.0.0.0:9187\")" (.Values.config.metrics | default dict).listen }}
{{- regexFind "[0-9]+$" $listen }}
{{- end }}

{{/*
The configuration with the chart's own additions: the password sources of
`secrets`. Returned as YAML, to be read back with fromYaml.
*/}}
{{- define "outboxd.effectiveConfig" -}}
{{- $cfg := deepCopy .Values.config }}
{{- if .Values.secrets.postgresPassword.name }}
{{- $pg := $cfg.postgres | default dict }}
{{- $_ := set $pg "password_env" "OUTBOXD_PG_PASSWORD" }}
{{- $_ := set $cfg "postgres" $pg }}
{{- end }}
{{- if .Values.secrets.kafkaSaslPassword.name }}
{{- $kafka := $cfg.kafka | default dict }}
{{- $props := $kafka.properties | default dict }}
{{- $_ := set $props "sasl.password" "${OUTBOXD_KAFKA_SASL_PASSWORD}" }}
{{- $_ := set $kafka "properties" $props }}
{{- $_ := set $cfg "kafka" $kafka }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* A TOML key: bare when it can be, quoted otherwise. */}}
{{- define "outboxd.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/* A TOML value: strings as basic strings (JSON escapes are TOML's), whole numbers without an exponent, arrays of scalars. */}}
{{- define "outboxd.tomlValue" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- if eq (float64 (int64 .)) (float64 .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "outboxd.tomlValue" $v }}{{ end }}]
{{- else }}{{ fail (printf "config: cannot write %v (%s) as TOML" . (kindOf .)) }}
{{- end }}
{{- end }}

{{/*
One TOML table: its scalar keys, then its sub-tables, then its arrays of
tables. Called with (list "dotted.name" dict).
*/}}
{{- define "outboxd.tomlTable" -}}
{{- $name := index . 0 }}
{{- $body := index . 1 -}}
[{{ $name }}]
{{- range $k, $v := $body }}
{{- if not (or (kindIs "map" $v) (and (kindIs "slice" $v) (gt (len $v) 0) (kindIs "map" (first $v)))) }}
{{ include "outboxd.tomlKey" $k }} = {{ include "outboxd.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k, $v := $body }}
{{- if kindIs "map" $v }}

{{ include "outboxd.tomlTable" (list (printf "%s.%s" $name (include "outboxd.tomlKey" $k)) $v) }}
{{- end }}
{{- end }}
{{- range $k, $v := $body }}
{{- if and (kindIs "slice" $v) (gt (len $v) 0) (kindIs "map" (first $v)) }}
{{- range $item := $v }}

[[{{ $name }}.{{ include "outboxd.tomlKey" $k }}]]
{{- range $ik, $iv := $item }}
{{ include "outboxd.tomlKey" $ik }} = {{ include "outboxd.tomlValue" $iv }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "outboxd.toml" -}}
# Rendered by the outboxd Helm chart from .Values.config; every key is
# documented in config/outboxd.toml.
{{- range $section, $body := . }}

{{ include "outboxd.tomlTable" (list (include "outboxd.tomlKey" $section) $body) }}
{{- end }}
{{- end }}
