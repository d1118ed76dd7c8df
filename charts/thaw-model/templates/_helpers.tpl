{{- define "model.name" -}}{{ .Values.name | default .Release.Name | trunc 55 | trimSuffix "-" }}{{- end -}}
{{- define "model.labels" -}}
app.kubernetes.io/name: {{ include "model.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: model-server
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- /* An annotation's value as a string: numbers and booleans given with --set
(or in a values file) as --set-string would give them; whole numbers from a
values file (read as floats) without an exponent (1000000, not 1e+06). */ -}}
{{- define "model.annotationValue" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}{{ int64 . }}{{ else }}{{ . }}{{ end -}}
{{- end -}}

{{- /* The server's image: the llama.cpp example's when kind is llamacpp and the image was left at the vLLM default. */ -}}
{{- define "model.image" -}}
{{- $ex := index .Values.examples .Values.server.kind -}}
{{- if and (eq .Values.server.kind "llamacpp") (eq .Values.server.image "vllm/vllm-openai:v0.6.3") }}{{ $ex.image }}{{ else }}{{ .Values.server.image }}{{ end -}}
{{- end -}}

{{- /* The weights cache's type; a bare cache.pvc (chart 0.2) means pvc. */ -}}
{{- define "model.cacheType" -}}
{{- $c := .Values.server.cache -}}
{{- if and (eq ($c.type | default "emptyDir") "emptyDir") $c.pvc }}pvc{{ else }}{{ $c.type | default "emptyDir" }}{{ end -}}
{{- end -}}

{{- /* Combinations that cannot work fail the render with a reason. */ -}}
{{- define "model.checkCache" -}}
{{- $t := include "model.cacheType" . -}}
{{- $d := .Values.server.download -}}
{{- if and (eq $t "pvc") (not .Values.server.cache.pvc) }}{{ fail "server.cache.type=pvc needs server.cache.pvc, the name of an existing claim" }}{{ end -}}
{{- if ne ($d.mode | default "none") "none" -}}
{{- if and (not $d.model) (not $d.command) }}{{ fail "server.download.mode needs server.download.model (the Hub repository) or server.download.command" }}{{ end -}}
{{- if eq $t "emptyDir" }}{{ fail "server.download with an emptyDir cache would download at every start: use server.cache.type hostPath, pvc or sharedPvc" }}{{ end -}}
{{- if and (eq $d.mode "job") (eq $t "hostPath") }}{{ fail "a download Job fills only the node it runs on: with a hostPath cache use server.download.mode=initContainer" }}{{ end -}}
{{- if and (eq $t "sharedPvc") (eq .Values.server.cache.shared.accessMode "ReadOnlyMany") }}{{ fail "a ReadOnlyMany claim cannot be written: fill it another way (server.cache.shared.dataSource) and leave server.download.mode=none" }}{{ end -}}
{{- if and (eq $t "pvc") .Values.server.cache.readOnly }}{{ fail "server.cache.readOnly: the download cannot write the claim" }}{{ end -}}
{{- end -}}
{{- end -}}

{{- /* The file the download writes once the weights are complete. */ -}}
{{- define "model.downloadMarker" -}}
{{ .Values.server.cache.mountPath }}/.thaw-download-{{ printf "%s|%v" .Values.server.download.model .Values.server.download.command | sha256sum | trunc 12 }}
{{- end -}}

{{- /* The download's container (the Job's, or the pods' initContainer). */ -}}
{{- define "model.downloadContainer" -}}
{{- $d := .Values.server.download -}}
{{- $cmd := $d.command | default (list "huggingface-cli" "download" $d.model) -}}
name: download-weights
image: {{ $d.image | default (include "model.image" .) }}
imagePullPolicy: {{ .Values.server.imagePullPolicy }}
command: ["sh", "-c", "\"$@\" && touch \"$THAW_MARKER\"", "download"]
args:
  {{- toYaml $cmd | nindent 2 }}
env:
  {{- include "model.cacheEnv" . | nindent 2 }}
  - {name: THAW_MARKER, value: {{ include "model.downloadMarker" . | quote }}}
  {{- if $d.tokenSecret }}
  - name: HF_TOKEN
    valueFrom: {secretKeyRef: {name: {{ $d.tokenSecret }}, key: HF_TOKEN}}
  {{- end }}
{{- with $d.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  allowPrivilegeEscalation: false
  capabilities:
    drop: ["ALL"]
volumeMounts:
  - {name: cache, mountPath: {{ .Values.server.cache.mountPath }}}
{{- end -}}

{{- /* Where the servers look for weights: HF_HOME (vLLM, TGI, transformers) and LLAMA_CACHE (llama.cpp's -hf downloads). */ -}}
{{- define "model.cacheEnv" -}}
- {name: HF_HOME, value: {{ .Values.server.cache.mountPath | quote }}}
- {name: LLAMA_CACHE, value: {{ .Values.server.cache.mountPath | quote }}}
{{- end -}}

{{- /* The cache volume. */ -}}
{{- define "model.cacheVolume" -}}
{{- $t := include "model.cacheType" . -}}
{{- $c := .Values.server.cache -}}
- name: cache
{{- if eq $t "hostPath" }}
  hostPath: {path: {{ $c.hostPath }}, type: DirectoryOrCreate}
{{- else if eq $t "pvc" }}
  persistentVolumeClaim: {claimName: {{ $c.pvc }}}
{{- else if eq $t "sharedPvc" }}
  persistentVolumeClaim: {claimName: {{ include "model.name" . }}-weights}
{{- else }}
  emptyDir: {sizeLimit: {{ $c.sizeLimit }}}
{{- end }}
{{- end -}}
