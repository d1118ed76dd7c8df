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

{{- /* limits.drain_timeout_ms as thaw reads it: the value, or thaw's own default
(docs/configuration.md) when it is not set. */ -}}
{{- define "thaw.drainTimeoutMs" -}}
{{- $d := ((.Values.config).limits).drain_timeout_ms -}}
{{- if kindIs "invalid" $d }}30000{{ else }}{{ int64 $d }}{{ end -}}
{{- end -}}

{{- /* Combinations that cannot work fail the render with a reason. */ -}}
{{- define "thaw.checkValues" -}}
{{- $grace := int64 .Values.terminationGracePeriodSeconds -}}
{{- $drain := int64 (include "thaw.drainTimeoutMs" .) -}}
{{- if le (mul $grace 1000) $drain -}}
{{- fail (printf "terminationGracePeriodSeconds (%d s) must exceed config.limits.drain_timeout_ms (%d ms), or the kubelet kills an activator mid-drain: set terminationGracePeriodSeconds to at least %d, or lower the drain timeout" $grace $drain (add1 (div $drain 1000))) -}}
{{- end -}}
{{- end -}}

{{- /* Whether thaw's model RBAC (the ClusterRole, or a Role per watched
namespace) already covers namespace .ns. */ -}}
{{- define "thaw.watches" -}}
{{- if or (include "thaw.clusterScoped" .root) (has .ns .root.Values.watchNamespaces) }}true{{ end -}}
{{- end -}}
