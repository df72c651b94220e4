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

{{/*
The fingerprint of the policy the chart installs (webhook/install/fingerprint.py): the
SHA-256 of its spec as JSON, as `gpushare-webhook manifests` marks every admission object
it renders from it. Empty for policy.existingConfigMap where no cluster answers `lookup`
(helm template) or the ConfigMap does not exist yet.
*/}}
{{- define "gpushare.policySpec" -}}
{{- $spec := dict -}}
{{- $known := true -}}
{{- if .Values.policy.existingConfigMap -}}
{{- $found := lookup "v1" "ConfigMap" .Release.Namespace .Values.policy.existingConfigMap -}}
{{- $text := "" -}}
{{- if $found }}{{ $text = index ($found.data | default dict) "policy.yaml" | default "" }}{{ end -}}
{{- if $text -}}
{{- $spec = (fromYaml $text).spec | default dict -}}
{{- else -}}
{{- $known = false -}}
{{- end -}}
{{- else if .Values.policy.spec -}}
{{- $spec = .Values.policy.spec -}}
{{- else -}}
{{- $document := fromYaml (.Values.policy.file | default (.Files.Get "files/policy.yaml")) -}}
{{- if $document.Error -}}
{{- fail (printf "policy.file is not a YAML policy: %s" $document.Error) -}}
{{- end -}}
{{- $spec = $document.spec | default dict -}}
{{- end -}}
{{- if $known }}sha256:{{ toJson $spec | sha256sum }}{{ end -}}
{{- end }}

{{/*
Every admission object the chart renders comes from the policy it installs: each text
(given, or the chart's default-policy copy in files/) carries the fingerprint of the policy
it was rendered from, and a difference fails the render. So a policy of your own is never
installed with the default policy's mutation, CEL rules or scope, and nothing has to put
them right afterwards.
*/}}
{{- define "gpushare.checkRendered" -}}
{{- if and .Values.policy.spec .Values.policy.file -}}
{{- fail "policy.spec and policy.file both set: give the policy one way" -}}
{{- end -}}
{{- if and .Values.policy.existingConfigMap (or .Values.policy.spec .Values.policy.file) -}}
{{- fail "policy.existingConfigMap is set together with policy.spec or policy.file: give the policy one way" -}}
{{- end -}}
{{- $want := include "gpushare.policySpec" . -}}
{{- $inApiserver := include "gpushare.inApiserver" . -}}
{{- $pieces := list -}}
{{- if and $inApiserver .Values.clusterView.enabled -}}
{{- $pieces = append $pieces (list "policy.viewMatchConditions" .Values.policy.viewMatchConditions "files/view-match-conditions.yaml" false) -}}
{{- else if not $inApiserver -}}
{{- $pieces = append $pieces (list "policy.matchConditions" .Values.policy.matchConditions "files/match-conditions.yaml" false) -}}
{{- end -}}
{{- if .Values.celPolicies.enabled -}}
{{- $pieces = append $pieces (list "celPolicies.manifests" .Values.celPolicies.manifests "files/celpolicies.yaml" true) -}}
{{- end -}}
{{- if $inApiserver -}}
{{- $pieces = append $pieces (list "mutatingPolicies.manifests" .Values.mutatingPolicies.manifests "files/mutatingpolicies.yaml" true) -}}
{{- end -}}
{{- $policy := "the default policy" -}}
{{- if .Values.policy.spec }}{{ $policy = "policy.spec" }}{{ else if .Values.policy.file }}{{ $policy = "policy.file" }}{{ else if .Values.policy.existingConfigMap }}{{ $policy = printf "the ConfigMap %s" .Values.policy.existingConfigMap }}{{ end -}}
{{- $fix := "render the policy with every admission object in one values file, `gpushare-webhook manifests --helm-values --policy POLICY.yaml > policy-values.yaml`, and install with --values policy-values.yaml" -}}
{{- range $pieces -}}
{{- $name := index . 0 -}}
{{- $given := index . 1 -}}
{{- $text := $given | default ($.Files.Get (index . 2)) -}}
{{- $found := list -}}
{{- if index . 3 -}}
{{- range regexSplit "(?m)^---[ \t]*$" $text -1 -}}
{{- $object := fromYaml . -}}
{{- if $object.Error }}{{ fail (printf "%s: not YAML: %s" $name $object.Error) }}{{ end -}}
{{- if $object.kind -}}
{{- $annotations := ($object.metadata | default dict).annotations | default dict -}}
{{- $found = append $found (index $annotations "gpushare.io/policy-spec" | default "") -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $found = append $found ((fromYaml $text).policySpec | default "") -}}
{{- end -}}
{{- $whose := ternary $name (printf "%s (empty: the chart's default-policy copy)" $name) (ne $given "") -}}
{{- range $found -}}
{{- if not . -}}
{{- fail (printf "%s carries no policy fingerprint (gpushare.io/policy-spec), so nothing says which policy it was rendered from: %s" $whose $fix) -}}
{{- end -}}
{{- if not $want -}}
{{- if not $given -}}
{{- fail (printf "%s is the default policy's, but %s holds the policy: %s" $whose $policy $fix) -}}
{{- end -}}
{{- $want = . -}}
{{- end -}}
{{- if ne . $want -}}
{{- fail (printf "%s was rendered from another policy (%s) than %s (%s): %s" $whose . $policy $want $fix) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
Which install this render is and why, in words: a comment on the rendered Deployment and
the first line of the NOTES. `helm template` without a cluster sees no
MutatingAdmissionPolicy v1, so admission.mode=auto renders the webhook install there.
*/}}
{{- define "gpushare.installChoice" -}}
{{- $mode := .Values.admission.mode -}}
{{- if include "gpushare.inApiserver" . -}}
the 1.36+ install (the mutation and rules as admission policies in the apiserver): {{ if eq $mode "auto" }}admission.mode=auto, and the apiserver Helm asked serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy{{ else }}admission.mode={{ $mode }}{{ end }}
{{- else -}}
the webhook install (both webhooks registered): {{ if eq $mode "auto" }}admission.mode=auto, and Helm saw no admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (helm template without a cluster never does; for Kubernetes 1.36+ pass --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy or --set admission.mode=apiserver){{ else }}admission.mode={{ $mode }}{{ end }}
{{- end -}}
{{- end }}
