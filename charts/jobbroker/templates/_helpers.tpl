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
Name of the chart-managed etcd's StatefulSet and Service prefix: "<fullname>-etcd", with the
fullname cut to 47 characters so that "-headless" and the pods' controller-revision-hash label
(the StatefulSet's name and 11 more) still fit in 63.
*/}}
{{- define "jobbroker.etcd.name" -}}
{{- printf "%s-etcd" (include "jobbroker.fullname" . | trunc 47 | trimSuffix "-") }}
{{- end }}

{{/*
Selector labels of the etcd members: another app.kubernetes.io/name than the broker's, so that
neither the broker's StatefulSet, Services and PodDisruptionBudget nor etcd's select the other's pods.
*/}}
{{- define "jobbroker.etcd.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-etcd" (include "jobbroker.name" . | trunc 58 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of the etcd resources.
*/}}
{{- define "jobbroker.etcd.labels" -}}
{{ include "jobbroker.commonLabels" . }}
{{ include "jobbroker.etcd.selectorLabels" . }}
app.kubernetes.io/component: etcd
{{- end }}

{{/*
DNS name of chart-managed etcd member N (its pod under the headless Service): call with
(list $ N).
*/}}
{{- define "jobbroker.etcd.host" -}}
{{- $ := index . 0 }}
{{- $etcd := include "jobbroker.etcd.name" $ }}
{{- printf "%s-%d.%s-headless.%s.svc.%s" $etcd (int (index . 1)) $etcd $.Release.Namespace $.Values.cluster.clusterDomain }}
{{- end }}

{{/*
DNS names of every chart-managed etcd member, space-separated.
*/}}
{{- define "jobbroker.etcd.hosts" -}}
{{- $hosts := list }}
{{- range $i := until (int .Values.cluster.etcd.replicaCount) }}
{{- $hosts = append $hosts (include "jobbroker.etcd.host" (list $ $i)) }}
{{- end }}
{{- join " " $hosts }}
{{- end }}

{{/*
etcd's client URLs for --cluster-etcd: every chart-managed member, or cluster.etcd.endpoints.
*/}}
{{- define "jobbroker.etcd.endpoints" -}}
{{- if .Values.cluster.etcd.create }}
{{- $urls := list }}
{{- range (splitList " " (include "jobbroker.etcd.hosts" .)) }}
{{- $urls = append $urls (printf "http://%s:%d" . (int $.Values.cluster.etcd.clientPort)) }}
{{- end }}
{{- join "," $urls }}
{{- else }}
{{- join "," .Values.cluster.etcd.endpoints }}
{{- end }}
{{- end }}

{{/*
topologySpreadConstraints from a list of values: call with (list CONSTRAINTS SELECTOR_LABELS_YAML).
An entry without a labelSelector gets one that matches the pods it spreads.
*/}}
{{- define "jobbroker.topologySpread" -}}
{{- $selector := fromYaml (index . 1) }}
{{- $out := list }}
{{- range (index . 0) }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
{{- $out = append $out $c }}
{{- end }}
{{- toYaml $out }}
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
{{- if .Values.cluster.enabled }}
{{- include "jobbroker.validateCluster" . }}
{{- else if and (gt (int .Values.replicaCount) 1) (not .Values.acknowledgeIndependentReplicas) }}
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

{{/*
Checks of cluster mode's values.
*/}}
{{- define "jobbroker.validateCluster" -}}
{{- $c := .Values.cluster }}
{{- if lt (int .Values.replicaCount) (int $c.replicationFactor) }}
{{- fail (printf "cluster.enabled: replicaCount is %d, fewer nodes than cluster.replicationFactor (%d): every partition needs that many nodes for its replicas, and none would be placed. Set replicaCount to at least %d (3 nodes for the default replication factor 3)." (int .Values.replicaCount) (int $c.replicationFactor) (int $c.replicationFactor)) }}
{{- end }}
{{- if gt (int $c.minInSync) (int $c.replicationFactor) }}
{{- fail (printf "cluster.minInSync (%d) exceeds cluster.replicationFactor (%d): a write could never be fsynced on that many replicas" (int $c.minInSync) (int $c.replicationFactor)) }}
{{- end }}
{{- if not .Values.persistence.enabled }}
{{- fail "cluster.enabled needs persistence.enabled: a node must come back with its data (a replica in an in-sync set that returns empty is not supported), and an emptyDir goes with the pod" }}
{{- end }}
{{- if .Values.persistence.existingClaim }}
{{- fail "persistence.existingClaim cannot be used in cluster mode: every node needs a claim of its own (the StatefulSet's volumeClaimTemplate)" }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- fail "cluster.enabled with tls.enabled is not supported yet: the nodes dial each other's gRPC port without TLS (replication and forwarding), so they could not reach a TLS port. Keep the nodes on a private network with auth.enabled and the NetworkPolicy" }}
{{- end }}
{{- if and $c.etcd.create $c.etcd.endpoints }}
{{- fail "cluster.etcd: create is true and endpoints are given; choose one: create: false to use the endpoints of an existing etcd, or no endpoints to run etcd in the release" }}
{{- end }}
{{- if and (not $c.etcd.create) (not $c.etcd.endpoints) }}
{{- fail "cluster.etcd: no etcd: set cluster.etcd.create: true to run etcd in the release, or list an existing etcd's client URLs in cluster.etcd.endpoints" }}
{{- end }}
{{- if lt (int .Values.terminationGracePeriodSeconds) (add (int $c.preStopSleepSeconds) 10 | int) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least cluster.preStopSleepSeconds (%d) + 10: after the preStop sleep a node needs up to 5 s to hand its leaderships over and then drains; a SIGKILL before that leaves its partitions leaderless for a lease TTL" (int .Values.terminationGracePeriodSeconds) (int $c.preStopSleepSeconds)) }}
{{- end }}
{{- end }}
