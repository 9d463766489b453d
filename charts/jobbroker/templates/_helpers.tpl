{{/*
Chart name, at most 63 characters (a DNS label).
*/}}
{{- define "jobbroker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name of the release's resources: "<release>-<chart>", or just the release name
when it already contains the chart name. Kept to 52 characters so that suffixes such as
"-headless" and the StatefulSet's pod and claim names still fit in 63.
*/}}
{{- define "jobbroker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"name-version" for the helm.sh/chart label.
*/}}
{{- define "jobbroker.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource (Kubernetes recommended labels).
*/}}
{{- define "jobbroker.labels" -}}
{{ include "jobbroker.commonLabels" . }}
{{ include "jobbroker.selectorLabels" . }}
app.kubernetes.io/component: broker
{{- end }}

{{/*
Labels shared by the broker's resources and the helm test pod (which must not carry the
selector labels, or the Services would pick it).
*/}}
{{- define "jobbroker.commonLabels" -}}
helm.sh/chart: {{ include "jobbroker.chart" . }}
app.kubernetes.io/version: {{ (.Values.image.tag | default .Chart.AppVersion) | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/part-of: jobbroker
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: immutable on a StatefulSet, so only name and instance.
*/}}
{{- define "jobbroker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jobbroker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Name of the ServiceAccount the pod runs as.
*/}}
{{- define "jobbroker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "jobbroker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference: repository:tag, or repository@digest when a digest is given.
*/}}
{{- define "jobbroker.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
Label that lets a pod through the NetworkPolicy to both ports.
*/}}
{{- define "jobbroker.clientLabel" -}}
{{ include "jobbroker.fullname" . }}-client
{{- end }}

{{/*
The ServerConfig JSON of the --config file, from .Values.config. Empty sections are left out.
*/}}
{{- define "jobbroker.serverConfig" -}}
{{- $cfg := dict }}
{{- with .Values.config.defaultPolicy }}
{{- $_ := set $cfg "defaultPolicy" . }}
{{- end }}
{{- with .Values.config.queues }}
{{- $_ := set $cfg "queues" . }}
{{- end }}
{{- toPrettyJson $cfg }}
{{- end }}

{{/*
Checks of combinations that values.schema.json cannot express; each fails the render with the reason.
*/}}
{{- define "jobbroker.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.acknowledgeIndependentReplicas) }}
{{- fail (printf "replicaCount is %d, but jobbroker is a single-node broker: each replica would be a separate broker with its own data, and the Service would spread clients over them, so jobs enqueued on one are never leased from another. Keep replicaCount 1 (failover is Kubernetes rescheduling the pod with its volume), or set acknowledgeIndependentReplicas=true if you really want independent brokers." (int .Values.replicaCount)) }}
{{- end }}
{{- if and .Values.persistence.existingClaim (gt (int .Values.replicaCount) 1) }}
{{- fail "persistence.existingClaim can be used with replicaCount 1 only: one claim cannot hold the data of two brokers" }}
{{- end }}
{{- if and .Values.auth.enabled (not .Values.auth.secretName) }}
{{- fail "auth.enabled is true but auth.secretName is empty: name a Secret with the key tokens.json (the --auth-tokens file, docs/security.md)" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled is true but tls.secretName is empty: name a Secret of type kubernetes.io/tls (tls.crt, tls.key, and ca.crt when tls.clientCA is true)" }}
{{- end }}
{{- if and .Values.tls.clientCA (not .Values.tls.enabled) }}
{{- fail "tls.clientCA is true but tls.enabled is false: mTLS needs TLS" }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable) (kindIs "invalid" .Values.podDisruptionBudget.minAvailable) }}
{{- fail "podDisruptionBudget: set maxUnavailable or minAvailable" }}
{{- end }}
{{- end }}
