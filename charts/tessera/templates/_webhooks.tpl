{{/* The admission webhook configurations (extender/webhook.py serves them). Rendered by
     extender-tls.yaml, which alone knows the CA of the serving certificate: .caBundle (base64
     PEM) or .annotations (cert-manager's CA injector). Paths, rules and policies must match
     tessera/dev/localcluster.py webhook_configurations (tests/unit/test_chart_rendered.py). */}}
{{- define "tessera.webhooks" -}}
{{- $root := .root }}
{{- $webhooks := $root.Values.extender.webhooks }}
{{- $ctx := dict "root" $root "component" "extender" }}
{{- $name := include "tessera.extender.name" $root }}
{{- $service := dict "name" (printf "%s-webhook" $name) "namespace" $root.Release.Namespace "port" 443 }}
{{- $caBundle := .caBundle }}
{{- $common := dict "admissionReviewVersions" (list "v1") "sideEffects" "None" "failurePolicy" $webhooks.failurePolicy "timeoutSeconds" (int $webhooks.timeoutSeconds) }}
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: {{ $name }}
  labels:
    {{- include "tessera.labels" $ctx | nindent 4 }}
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
webhooks:
  # The queue label, schedulerName and the admission gate of new pods (never refuses one).
  - name: pods.scheduling.tessera.dev
    clientConfig:
      service: {{ toJson (merge (dict "path" "/mutate-pods") $service) }}
      {{- with $caBundle }}
      caBundle: {{ . }}
      {{- end }}
    rules:
      - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods], scope: Namespaced}
    namespaceSelector:
      matchExpressions:
        - key: kubernetes.io/metadata.name
          operator: NotIn
          values: {{ toJson (uniq (append $webhooks.excludeNamespaces $root.Release.Namespace)) }}
    reinvocationPolicy: Never
    {{- toYaml $common | nindent 4 }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: {{ $name }}
  labels:
    {{- include "tessera.labels" $ctx | nindent 4 }}
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
webhooks:
  # Cycles, unknown parents, a limit below its quota: refused at the API.
  - name: queues.scheduling.tessera.dev
    clientConfig:
      service: {{ toJson (merge (dict "path" "/validate-queues") $service) }}
      {{- with $caBundle }}
      caBundle: {{ . }}
      {{- end }}
    rules:
      - {apiGroups: [scheduling.tessera.dev], apiVersions: [v1alpha1], operations: [CREATE, UPDATE], resources: [queues], scope: Cluster}
    {{- toYaml $common | nindent 4 }}
  # A namespace's default queue must be one the namespace may use (the Queue's namespaces and
  # namespaceSelector); only namespaces that carry the label are sent.
  - name: namespaces.scheduling.tessera.dev
    clientConfig:
      service: {{ toJson (merge (dict "path" "/validate-namespaces") $service) }}
      {{- with $caBundle }}
      caBundle: {{ . }}
      {{- end }}
    rules:
      - {apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [namespaces], scope: Cluster}
    objectSelector:
      matchExpressions:
        - {key: scheduling.tessera.dev/default-queue, operator: Exists}
    {{- toYaml $common | nindent 4 }}
  # The driver's opaque GpuConfig: a bad one is refused at kubectl apply, naming the field.
  - name: resourceclaims.scheduling.tessera.dev
    clientConfig:
      service: {{ toJson (merge (dict "path" "/validate-resourceclaims") $service) }}
      {{- with $caBundle }}
      caBundle: {{ . }}
      {{- end }}
    rules:
      - {apiGroups: [resource.k8s.io], apiVersions: [v1], operations: [CREATE], resources: [resourceclaims, resourceclaimtemplates], scope: Namespaced}
    {{- toYaml $common | nindent 4 }}
{{- end -}}
