{{- define "model.name" -}}{{ .Values.name | default .Release.Name | trunc 55 | trimSuffix "-" }}{{- end -}}
{{- define "model.labels" -}}
app.kubernetes.io/name: {{ include "model.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: model-server
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
