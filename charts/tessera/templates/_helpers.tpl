{{/* Base name of every object: the release name, with "-tessera" unless it already says so. */}}
{{- define "tessera.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tessera.extender.name" -}}{{ include "tessera.fullname" . }}-extender{{- end -}}
{{- define "tessera.scheduler.name" -}}{{ include "tessera.fullname" . }}-scheduler{{- end -}}
{{- define "tessera.draDriver.name" -}}{{ include "tessera.fullname" . }}-dra-driver{{- end -}}

{{/* In-cluster DNS name of the extender Service; also the TLS server name. */}}
{{- define "tessera.extender.host" -}}
{{ include "tessera.extender.name" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{- define "tessera.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Labels on every object; "component" is the half it belongs to. */}}
{{- define "tessera.labels" -}}
{{ include "tessera.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Scheduling constraints of one component's pods, from its values block. */}}
{{- define "tessera.placement" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- /* Label values are strings; quoted so `present: true` in values stays valid. */}}
  {{- range $key, $value := . }}
  {{ $key }}: {{ $value | toString | quote }}
  {{- end }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "tessera.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* KubeSchedulerConfiguration whose one profile calls the extender. */}}
{{- define "tessera.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  # Its own lease, so it never competes with the cluster's default scheduler.
  resourceName: {{ include "tessera.scheduler.name" . }}
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: {{ .Values.scheduler.schedulerName }}
    # Every feasible node is scored, so Tessera's ranking sees the whole cluster.
    percentageOfNodesToScore: {{ .Values.scheduler.percentageOfNodesToScore }}
    {{- if .Values.scheduler.packingScores }}
    # The default scoring plugins that spread pods by CPU and memory (least allocated, balanced
    # allocation) fight Tessera's packing: off for scoring, still on for filtering.
    plugins:
      score:
        disabled:
          - name: NodeResourcesFit
          - name: NodeResourcesBalancedAllocation
    {{- end }}
extenders:
  - urlPrefix: {{ ternary "https" "http" .Values.extender.tls.enabled }}://{{ include "tessera.extender.host" . }}:{{ .Values.extender.port }}
    filterVerb: filter
    prioritizeVerb: prioritize
    preemptVerb: preempt
    {{- if .Values.extender.bind }}
    bindVerb: bind
    {{- end }}
    weight: {{ .Values.scheduler.extenderWeight }}
    nodeCacheCapable: true
    httpTimeout: {{ .Values.scheduler.httpTimeout }}
    # A filter error (e.g. while the extender restarts) retries the pod instead of scheduling it
    # without queue fairness.
    ignorable: false
    {{- if not .Values.scheduler.deploy }}
    # In the cluster's own scheduler: only pods asking for these call the extender (and wait
    # while it is down); every other pod is scheduled without it.
    managedResources:
      {{- range .Values.scheduler.managedResources }}
      - name: {{ .name }}
        ignoredByScheduler: {{ .ignoredByScheduler | default false }}
      {{- end }}
    {{- end }}
    enableHTTPS: {{ .Values.extender.tls.enabled }}
    {{- if .Values.extender.tls.enabled }}
    tlsConfig:
      serverName: {{ include "tessera.extender.host" . }}
      caFile: /etc/tessera/extender-client/ca.crt
      {{- if .Values.extender.tls.verifyClients }}
      certFile: /etc/tessera/extender-client/tls.crt
      keyFile: /etc/tessera/extender-client/tls.key
      {{- end }}
    {{- end }}
{{- end -}}

{{/* A component's ServiceAccount, named like the component. */}}
{{- define "tessera.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "tessera.labels" . | nindent 4 }}
{{- end -}}

{{/* Binds a role to the component's ServiceAccount .name: a .kind (ClusterRoleBinding or
     RoleBinding, in .namespace) named .name + .suffix, to the .roleKind named .role. */}}
{{- define "tessera.binding" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}
metadata:
  name: {{ .name }}{{ .suffix }}
  {{- with .namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- include "tessera.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ .roleKind }}
  name: {{ .role }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ .root.Release.Namespace }}
{{- end -}}
