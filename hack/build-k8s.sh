#!/usr/bin/env bash
# Builds the control-plane binaries the tests run (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl, helm) from the Go modules pinned in hack/k8s/go.mod.
# Binaries land in a cache directory keyed by version, outside the checkout, so a fresh clone
# reuses them; a second run with everything present does nothing.
# Prints the directory holding the binaries as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/k8s/go.mod")
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$here/k8s/go.mod")
helm_version=v3.21.4
cache_root=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
bin_dir="$cache_root/k8s-$k8s_version-etcd-$etcd_version-helm-$helm_version/bin"
mkdir -p "$bin_dir"

log() { printf '[build-k8s] %s\n' "$*" >&2; }
# Go is needed only when something is left to build; checked once, before the first build.
go_checked=
need_go() { [[ -n $go_checked ]] || bash "$here/require.sh" go; go_checked=1; }

minor=${k8s_version#v1.}; minor=${minor%%.*}
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
etcd_ldflags="-s -w"
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"

export CGO_ENABLED=0
# One compile at a time keeps peak memory near 2 GiB on the 2-core machines.
export GOFLAGS="${GOFLAGS:-} -p=${TESSERA_GO_PARALLEL:-2}"

build() { # name package ldflags
  local name=$1 pkg=$2 ldflags=$3
  if [[ -x "$bin_dir/$name" ]]; then
    log "$name: cached"
    return
  fi
  need_go
  log "$name: building $pkg (cold builds take minutes)"
  local start=$SECONDS
  (cd "$here/k8s" && go build -trimpath -ldflags "$ldflags" -o "$bin_dir/$name.tmp" "$pkg")
  mv "$bin_dir/$name.tmp" "$bin_dir/$name"
  log "$name: built in $((SECONDS - start))s, $(du -h "$bin_dir/$name" | cut -f1)"
}

build etcd go.etcd.io/etcd/server/v3 "$etcd_ldflags"
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
build kubectl k8s.io/kubernetes/cmd/kubectl "$k8s_ldflags"
if [[ ! -x "$bin_dir/helm" ]]; then
  need_go
  log "helm: building helm.sh/helm/v3/cmd/helm@$helm_version"
  start=$SECONDS
  # helm has no replace directives, so go install builds it outside our module's graph.
  (cd "$cache_root" && GOBIN="$bin_dir" go install -trimpath -ldflags "$helm_ldflags" \
    "helm.sh/helm/v3/cmd/helm@$helm_version")
  log "helm: built in $((SECONDS - start))s, $(du -h "$bin_dir/helm" | cut -f1)"
else
  log "helm: cached"
fi
echo "$bin_dir"
