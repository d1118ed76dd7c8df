{{- define "thaw.name" -}}thaw{{- end -}}
{{- define "thaw.fullname" -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "thaw.labels" -}}
app.kubernetes.io/name: thaw
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "thaw.selector" -}}
app.kubernetes.io/name: thaw
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "thaw.clusterScoped" -}}{{ if eq (len .Values.watchNamespaces) 0 }}true{{ end }}{{- end -}}
