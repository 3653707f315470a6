#!/usr/bin/env bash
# Tessera on kind, for users with Docker: a cluster with the DRA feature gates and CDI
# (hack/kind/config.yaml), the image built and loaded into its nodes, and the chart installed with
# the DRA driver on simulated GPUs on the two workers (hack/kind/values.yaml).
#
#   hack/kind-up.sh            # then: kubectl apply -f manifests/examples/two-teams.yaml
#
# Environment: TESSERA_KIND_CLUSTER (default tessera), TESSERA_IMAGE (default tessera:dev),
# TESSERA_NAMESPACE (default tessera-system). Needs docker, kind, kubectl and helm on PATH.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
cluster=${TESSERA_KIND_CLUSTER:-tessera}
image=${TESSERA_IMAGE:-tessera:dev}
namespace=${TESSERA_NAMESPACE:-tessera-system}

log() { printf '[kind-up] %s\n' "$*" >&2; }

for tool in docker kind kubectl helm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    log "$tool is not on PATH; install it first (https://kind.sigs.k8s.io/docs/user/quick-start/)"
    exit 1
  fi
done

if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  log "cluster $cluster exists; reusing it (kind delete cluster --name $cluster to start over)"
else
  log "creating kind cluster $cluster"
  kind create cluster --name "$cluster" --config "$here/kind/config.yaml"
fi
context="kind-$cluster"

log "building $image"
docker build --tag "$image" "$root"
log "loading $image into the nodes of $cluster"
kind load docker-image "$image" --name "$cluster"

log "installing charts/tessera into $namespace"
helm upgrade --install tessera "$root/charts/tessera" \
  --kube-context "$context" \
  --namespace "$namespace" --create-namespace \
  --values "$here/kind/values.yaml" \
  --set "image.repository=${image%:*}" --set "image.tag=${image##*:}" \
  --wait --timeout 5m

log "waiting for the simulated GPUs to be published"
for _ in $(seq 60); do
  if [[ $(kubectl --context "$context" get resourceslices --no-headers 2>/dev/null | wc -l) -ge 2 ]]; then
    break
  fi
  sleep 2
done
kubectl --context "$context" get nodes,resourceslices
cat <<USAGE

Tessera is installed on kind cluster $cluster (context $context). Try:
  kubectl --context $context apply -f $root/manifests/examples/two-teams.yaml
  kubectl --context $context get queues,pods,resourceclaims
Remove it: kind delete cluster --name $cluster
USAGE
