{{/* Names and labels, in the standard app.kubernetes.io/* form. */}}
{{- define "loopguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "loopguard.fullname" -}}
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

{{- define "loopguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loopguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "loopguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "loopguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: loop-guard
{{- end }}

{{- define "loopguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "loopguard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding admin-token / nats-user / nats-password / nats-token / nkey-seed, if any. */}}
{{- define "loopguard.secretName" -}}
{{- $a := .Values.auth }}
{{- if $a.existingSecret }}
{{- $a.existingSecret }}
{{- else if or $a.adminToken $a.natsUser $a.natsPassword $a.natsToken $a.natsNkeySeed }}
{{- include "loopguard.fullname" . }}
{{- end }}
{{- end }}

{{/* A TOML value: strings as JSON strings (whose escapes are all TOML's; Go's
`quote` writes \a, \v and \x.. for control characters, which TOML refuses), whole
numbers as integers (YAML numbers reach templates as float64, which would print
100000 as 1e+06), fractions (similar.threshold) as they are, the rest as is. */}}
{{- define "loopguard.toml" -}}
{{- if kindIs "string" . }}{{ . | toJson }}
{{- else if kindIs "slice" . }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "loopguard.toml" $v }}{{ end }}]
{{- else if and (kindIs "float64" .) (ne (float64 .) (float64 (int64 .))) }}{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}{{ int64 . }}
{{- else }}{{ . }}
{{- end }}
{{- end }}

{{/* loopguard.toml, rendered from .Values.config. */}}
{{- define "loopguard.config" -}}
# Rendered by the loopguard Helm chart from .Values.config.
# Secrets (admin token, NATS credentials) come from the environment.
mode = {{ include "loopguard.toml" .Values.config.mode }}
{{ include "loopguard.config.restart" . }}
{{ include "loopguard.config.live" . }}
{{- end }}

{{/* The sections loopguard reads at start only (a reload names them and
leaves them): a change to them must restart the pod. */}}
{{- define "loopguard.config.restart" -}}
{{- $c := .Values.config }}
[nats]
url = {{ include "loopguard.toml" $c.nats.url }}
prefix = {{ include "loopguard.toml" $c.nats.prefix }}
subscription_capacity = {{ include "loopguard.toml" $c.nats.subscription_capacity }}
{{- /* Absent from values reused from a chart before 0.9.0: loopguard's default. */}}
{{- with $c.nats.ping_interval_seconds }}
ping_interval_seconds = {{ include "loopguard.toml" . }}
{{- end }}
{{- with .Values.auth.credentialsSecret }}
credentials_file = "/etc/loopguard/nats/nats.creds"
{{- end }}
{{- with $c.nats.jetstream }}

[nats.jetstream]
{{- range $k, $v := . }}
{{ $k }} = {{ include "loopguard.toml" $v }}
{{- end }}
{{- end }}
{{- if .Values.auth.tlsSecret }}

[nats.tls]
required = true
{{- /* Absent from values reused from a chart before 0.12.0: the CA. */}}
{{- if ne .Values.auth.tlsCA false }}
ca_file = "/etc/loopguard/tls/ca.crt"
{{- end }}
{{- if .Values.auth.tlsClientCertificate }}
cert_file = "/etc/loopguard/tls/tls.crt"
key_file = "/etc/loopguard/tls/tls.key"
{{- end }}
{{- end }}

[http]
{{- $address := $c.http.address | default "0.0.0.0" }}
{{- if contains ":" $address }}{{ $address = printf "[%s]" $address }}{{ end }}
listen = {{ printf "%s:%d" $address (int64 $c.http.port) | quote }}

[state]
max_worlds = {{ include "loopguard.toml" $c.state.max_worlds }}
max_bytes = {{ include "loopguard.toml" $c.state.max_bytes }}
idle_seconds = {{ include "loopguard.toml" $c.state.idle_seconds }}
context_messages = {{ include "loopguard.toml" $c.state.context_messages }}

[shutdown]
grace_seconds = {{ include "loopguard.toml" $c.shutdown.grace_seconds }}

[log]
format = {{ include "loopguard.toml" $c.log.format }}
level = {{ include "loopguard.toml" $c.log.level }}

[runtime]
threads = {{ include "loopguard.toml" $c.runtime.threads }}

[reload]
watch_seconds = {{ include "loopguard.toml" $c.reload.watch_seconds }}
{{- end }}

{{/* The sections a reload applies (mode is above, a top-level key). */}}
{{- define "loopguard.config.live" -}}
{{- $c := .Values.config }}
[events]
approved = {{ $c.events.approved }}

[limits]
max_payload_bytes = {{ include "loopguard.toml" $c.limits.max_payload_bytes }}

[conversation]
{{- range $k, $v := $c.conversation }}
{{ $k }} = {{ include "loopguard.toml" $v }}
{{- end }}
{{- range $rule, $keys := $c.rules }}

[rules.{{ $rule }}]
{{- range $k, $v := $keys }}
{{ $k }} = {{ include "loopguard.toml" $v }}
{{- end }}
{{- end }}
{{- range $world, $w := $c.worlds }}

[worlds.{{ $world | quote }}]
{{- if $w.agents }}
agents = {{ include "loopguard.toml" $w.agents }}
{{- end }}
{{- range $rule, $keys := ($w.rules | default dict) }}
{{- range $k, $v := $keys }}
rules.{{ $rule }}.{{ $k }} = {{ include "loopguard.toml" $v }}
{{- end }}
{{- end }}
{{- end }}
{{ end }}
