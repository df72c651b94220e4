{{/*
Labels of every object: those of deploy/ plus commonLabels. No Helm bookkeeping labels:
names are fixed (one release per cluster), and the defaults render what deploy/ does.
*/}}
{{- define "gpushare.labels" -}}
app.kubernetes.io/name: gpushare-webhook
app.kubernetes.io/part-of: gpushare
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpushare.selectorLabels" -}}
app.kubernetes.io/name: gpushare-webhook
{{- end }}

{{- define "gpushare.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{ $image.repository }}@{{ $image.digest }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* True (non-empty) when the policy is not the bundled default one. */}}
{{- define "gpushare.customPolicy" -}}
{{- if or .Values.policy.spec .Values.policy.file .Values.policy.existingConfigMap }}true{{ end -}}
{{- end }}

{{- define "gpushare.policyConfigMap" -}}
{{- .Values.policy.existingConfigMap | default "gpushare-policy" -}}
{{- end }}

{{/*
The webhooks' matchConditions as a YAML list: the output of
`gpushare-webhook manifests --print-match-conditions` (policy.matchConditions), else the
default policy's (files/match-conditions.yaml, written by hack/update-match-conditions).
*/}}
{{- define "gpushare.matchConditions" -}}
{{- $text := .Values.policy.matchConditions | default (.Files.Get "files/match-conditions.yaml") -}}
{{- $document := fromYaml $text -}}
{{- $conditions := $document.matchConditions -}}
{{- if or $document.Error (not (kindIs "slice" $conditions)) (not $conditions) -}}
{{- fail "policy.matchConditions: expected the output of `gpushare-webhook manifests --print-match-conditions --policy FILE` (a YAML map whose matchConditions is a non-empty list)" -}}
{{- end -}}
{{- toYaml $conditions -}}
{{- end }}

{{- define "gpushare.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: [kube-system, {{ .Release.Namespace }}]
{{- end }}

{{/*
True (non-empty) for the install where MutatingAdmissionPolicies hold the mutation:
admission.mode apiserver, or auto where the apiserver serves MutatingAdmissionPolicy v1
(webhook.install.mode decides the same for `manifests` and the leader).
*/}}
{{- define "gpushare.inApiserver" -}}
{{- $mode := .Values.admission.mode -}}
{{- if or (eq $mode "apiserver") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")) }}true{{ end -}}
{{- end }}
