{{/*
Names and labels.
*/}}
{{- define "hookgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hookgate.fullname" -}}
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

{{- define "hookgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hookgate.labels" -}}
helm.sh/chart: {{ include "hookgate.chart" . }}
{{ include "hookgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "hookgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hookgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "hookgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hookgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hookgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Ports, taken from the addresses in config.toml so that there is one source.
*/}}
{{- define "hookgate.port" -}}
{{- regexFind "[0-9]+$" .Values.server.listen }}
{{- end }}

{{- define "hookgate.adminPort" -}}
{{- regexFind "[0-9]+$" .Values.server.admin_listen }}
{{- end }}

{{/*
A hookgate duration ("300ms", "30s", "5m", "1h 30m", "4d") in whole seconds,
rounded up.
*/}}
{{- define "hookgate.seconds" -}}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d)" . -1 }}
{{- $n := regexFind "^[0-9]+" . | float64 }}
{{- $unit := regexReplaceAll "^[0-9]+" . "" }}
{{- $factor := get (dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0) $unit }}
{{- $total = addf $total (mulf $n $factor) }}
{{- end }}
{{- ceil $total | int }}
{{- end }}

{{- define "hookgate.singleReplicaStore" -}}
{{- if has .Values.store.backend (list "sqlite" "memory") }}true{{ end }}
{{- end }}

{{- define "hookgate.terminationGracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add (include "hookgate.seconds" (.Values.server.shutdown_grace | default "20s") | int) 15 }}
{{- else }}
{{- .Values.terminationGracePeriodSeconds | int }}
{{- end }}
{{- end }}

{{/*
Combinations the schema cannot express. Included by the ConfigMap, which every
install renders, so a bad combination fails before anything is applied.
*/}}
{{- define "hookgate.validate" -}}
{{- $v := .Values }}
{{- $backend := $v.store.backend }}
{{- if and $v.app.enabled (include "hookgate.singleReplicaStore" .) }}
{{- if gt (int $v.replicaCount) 1 }}
{{- fail (printf "replicaCount is %d but store.backend %q keeps its dedupe keys inside one pod: each replica would have keys of its own and let the others' duplicates through. Use store.backend \"redis\" or \"postgres\" (shared by every replica), or replicaCount: 1." (int $v.replicaCount) $backend) }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.maxReplicas) 1) }}
{{- fail (printf "autoscaling.maxReplicas is %d but store.backend %q keeps its dedupe keys inside one pod: each replica would have keys of its own and let the others' duplicates through. Use store.backend \"redis\" or \"postgres\" to autoscale, or disable autoscaling." (int $v.autoscaling.maxReplicas) $backend) }}
{{- end }}
{{- end }}
{{- if and (has $backend (list "redis" "postgres")) (not $v.store.url) }}
{{- $fromEnv := false }}
{{- range $v.env }}{{ if eq .name "HOOKGATE_STORE__URL" }}{{ $fromEnv = true }}{{ end }}{{ end }}
{{- if not $fromEnv }}
{{- fail (printf "store.backend %q needs store.url, or an env entry HOOKGATE_STORE__URL (from a secretKeyRef when the URL carries a password)." $backend) }}
{{- end }}
{{- end }}
{{- if and (eq $backend "sqlite") (not (hasPrefix (printf "%s/" (trimSuffix "/" $v.persistence.mountPath)) ($v.store.path | default ""))) }}
{{- fail (printf "store.path %q must lie under persistence.mountPath %q: the root filesystem is read-only." ($v.store.path | default "") $v.persistence.mountPath) }}
{{- end }}
{{- $grace := include "hookgate.seconds" ($v.server.shutdown_grace | default "20s") | int }}
{{- if le (include "hookgate.terminationGracePeriodSeconds" . | int) $grace }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed server.shutdown_grace (%ds): the kubelet would kill the gate while it finishes in-flight deliveries." (include "hookgate.terminationGracePeriodSeconds" . | int) $grace) }}
{{- end }}
{{- if not $v.existingSecret }}
{{- $prefix := printf "file:%s/" (trimSuffix "/" $v.secretsMountPath) }}
{{- range $name, $p := $v.providers }}
{{- range $p.secrets }}
{{- $source := . }}
{{- if kindIs "map" . }}{{ $source = .source }}{{ end }}
{{- if hasPrefix $prefix $source }}
{{- fail (printf "providers.%s.secrets reads %s, but existingSecret is not set: name the Secret that holds it." $name (trimPrefix "file:" $source)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.sidecar.native (not (semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version)) }}
{{- fail (printf "sidecar.native needs Kubernetes 1.29 or later (this is %s): set sidecar.native: false." .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- end }}

{{/*
TOML rendering. Strings go through toJson: a JSON string is a valid TOML basic
string (same escapes, \uXXXX included). Numbers arrive from YAML as floats and
are written as integers when whole. Maps become inline tables, lists arrays;
null values are left out, so `key: null` falls back to hookgate's default.
*/}}
{{- define "hookgate.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{- define "hookgate.toml.value" -}}
{{- if kindIs "string" . }}
{{- toJson . }}
{{- else if kindIs "bool" . }}
{{- . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}
{{- if eq (float64 .) (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . }}
{{- $items := list }}
{{- range . }}{{ $items = append $items (include "hookgate.toml.value" .) }}{{ end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else if kindIs "map" . }}
{{- $pairs := list }}
{{- range $k, $v := . }}
{{- if not (kindIs "invalid" $v) }}
{{- $pairs = append $pairs (printf "%s = %s" (include "hookgate.toml.key" $k) (include "hookgate.toml.value" $v)) }}
{{- end }}
{{- end }}
{{- if $pairs }}{{ printf "{ %s }" (join ", " $pairs) }}{{ else }}{}{{ end }}
{{- else }}
{{- fail (printf "cannot write %v (%s) in config.toml" . (kindOf .)) }}
{{- end }}
{{- end }}

{{/* The key = value lines of one table. */}}
{{- define "hookgate.toml.table" -}}
{{- range $k, $v := . }}
{{- if not (kindIs "invalid" $v) }}
{{ include "hookgate.toml.key" $k }} = {{ include "hookgate.toml.value" $v }}
{{- end }}
{{- end }}
{{- end }}

{{/* config.toml */}}
{{- define "hookgate.config" -}}
{{- $upstream := deepCopy (.Values.upstream | default dict) }}
{{- if not $upstream.url }}
{{- $_ := set $upstream "url" (printf "http://127.0.0.1:%d" (int .Values.app.port)) }}
{{- end -}}
# Rendered by the {{ .Chart.Name }} chart from its values: change the values, not this file.

[server]
{{- include "hookgate.toml.table" .Values.server }}

[upstream]
{{- include "hookgate.toml.table" $upstream }}

[store]
{{- /* The default path is the chart's sqlite file: meaningless to other backends. */}}
{{- include "hookgate.toml.table" (ternary .Values.store (omit .Values.store "path") (eq .Values.store.backend "sqlite")) }}
{{- with .Values.telemetry }}

[telemetry]
{{- include "hookgate.toml.table" . }}
{{- end }}
{{- with .Values.queue }}

[queue]
{{- include "hookgate.toml.table" . }}
{{- end }}
{{- range $name, $provider := .Values.providers }}
{{- if not (kindIs "invalid" $provider) }}

[providers.{{ include "hookgate.toml.key" $name }}]
{{- include "hookgate.toml.table" $provider }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The gate's container, as a list item. Called with (dict "root" $ "native"
bool); the same definition serves the Deployment and the snippet NOTES prints
for an existing workload.
*/}}
{{- define "hookgate.container" -}}
- {{ include "hookgate.containerFields" . | indent 2 | trim }}
{{- end }}

{{- define "hookgate.containerFields" -}}
{{- $root := .root }}
{{- $v := $root.Values -}}
name: hookgate
image: {{ include "hookgate.image" $root }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- if .native }}
restartPolicy: Always
{{- end }}
args: ["run", "--config", "/etc/hookgate/config.toml"]
ports:
  - name: http
    containerPort: {{ include "hookgate.port" $root }}
    protocol: TCP
  - name: admin
    containerPort: {{ include "hookgate.adminPort" $root }}
    protocol: TCP
{{- with $v.env }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.envFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.startupProbe }}
startupProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.livenessProbe }}
livenessProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.readinessProbe }}
readinessProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumeMounts:
  - name: hookgate-config
    mountPath: /etc/hookgate
    readOnly: true
  {{- if $v.existingSecret }}
  - name: hookgate-secrets
    mountPath: {{ $v.secretsMountPath }}
    readOnly: true
  {{- end }}
  {{- if eq $v.store.backend "sqlite" }}
  - name: hookgate-data
    mountPath: {{ $v.persistence.mountPath }}
  {{- end }}
  - name: hookgate-tmp
    mountPath: /tmp
{{- end }}

{{/* The gate's volumes. */}}
{{- define "hookgate.volumes" -}}
- name: hookgate-config
  configMap:
    name: {{ include "hookgate.fullname" . }}
{{- if .Values.existingSecret }}
- name: hookgate-secrets
  secret:
    secretName: {{ .Values.existingSecret }}
    # Read-only for every uid: only the gate container mounts it, and no
    # fsGroup is needed (an existing workload may not set one).
    defaultMode: 0444
{{- end }}
{{- if eq .Values.store.backend "sqlite" }}
- name: hookgate-data
  {{- if .Values.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ .Values.persistence.existingClaim | default (include "hookgate.fullname" .) }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.persistence.sizeLimit }}
  {{- end }}
{{- end }}
- name: hookgate-tmp
  emptyDir:
    sizeLimit: 16Mi
{{- end }}
