{{/* Names and labels shared by every template. */}}
{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sluice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "sluice.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.adminTokenSecret" -}}
{{- .Values.controller.adminToken.existingSecret | default (printf "%s-admin-token" (include "sluice.fullname" .)) -}}
{{- end -}}

{{- define "sluice.postgresSecret" -}}
{{- .Values.controller.postgres.existingSecret | default (printf "%s-postgres" (include "sluice.fullname" .)) -}}
{{- end -}}

{{- define "sluice.controllerAddress" -}}
{{ include "sluice.fullname" . }}-controller.{{ .Release.Namespace }}.svc:{{ .Values.controller.ports.stream }}
{{- end -}}
