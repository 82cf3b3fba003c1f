{{/* Names, labels and small shared fragments. */}}

{{- define "vramguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-vramguard, or the release name when it already contains the chart's name. */}}
{{- define "vramguard.fullname" -}}
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

{{- define "vramguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "vramguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vramguard
{{- end }}

{{/* Selector labels of one component: include "vramguard.selectorLabels" (list . "operator") */}}
{{- define "vramguard.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "vramguard.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "vramguard.operator.fullname" -}}
{{- printf "%s-operator" (include "vramguard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vramguard.agent.fullname" -}}
{{- printf "%s-agent" (include "vramguard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vramguard.webhook.secretName" -}}
{{- default (printf "%s-webhook-tls" (include "vramguard.fullname" .)) .Values.webhook.tls.secretName }}
{{- end }}

{{- define "vramguard.operator.serviceAccountName" -}}
{{- default (include "vramguard.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- end }}

{{- define "vramguard.agent.serviceAccountName" -}}
{{- default (include "vramguard.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- end }}

{{/* image reference: include "vramguard.image" (list . .Values.operator.image) */}}
{{- define "vramguard.image" -}}
{{- $root := index . 0 }}{{- $image := index . 1 }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{/* The container security context shared by both components: no privilege of any kind. */}}
{{- define "vramguard.containerSecurityContext" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* A webhook's clientConfig: include "vramguard.webhook.clientConfig" (list . PATH CA_BUNDLE) */}}
{{- define "vramguard.webhook.clientConfig" -}}
{{- $root := index . 0 -}}
service:
  name: {{ include "vramguard.operator.fullname" $root }}
  namespace: {{ $root.Release.Namespace }}
  path: {{ index . 1 }}
  port: 443
{{- with index . 2 }}
caBundle: {{ . }}
{{- end }}
{{- end }}

{{- define "vramguard.stateKey.secretName" -}}
{{- default (printf "%s-state-key" (include "vramguard.operator.fullname" .)) .Values.operator.stateKey.existingSecret }}
{{- end }}
