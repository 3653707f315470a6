#!/usr/bin/env bash
# Packages charts/tessera into DIST/tessera-<version>.tgz (helm package), with the image digest
# `make release` built (DIST/image-digest) written into its values as image.digest, so the
# packaged chart pulls exactly that image from wherever image.repository points.
# Usage: hack/package-chart.sh DIST   (without DIST/image-digest: the chart as it is, by tag)
# helm is $HELM, else the one hack/build-k8s.sh builds (cached after the first build).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dist=$1
helm=${HELM:-"$(bash "$root/hack/build-k8s.sh" 2>/dev/null | tail -n 1)/helm"}
stage="$root/build/chart"

rm -rf "$stage"
mkdir -p "$stage" "$dist"
# -L: the chart's links to manifests/ (the CRD, DeviceClasses, default Queue) become files.
cp -rL "$root/charts/tessera" "$stage/tessera"
if [[ -s "$dist/image-digest" ]]; then
  digest=$(tr -d '[:space:]' <"$dist/image-digest")
  [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "bad digest in $dist/image-digest: $digest" >&2; exit 1; }
  # The one `digest: ""` line of values.yaml is image.digest's.
  [[ $(grep -c '^  digest: ""$' "$stage/tessera/values.yaml") == 1 ]] \
    || { echo "values.yaml has no single image.digest line to set" >&2; exit 1; }
  sed -i "s/^  digest: \"\"$/  digest: \"$digest\"/" "$stage/tessera/values.yaml"
fi
"$helm" lint --strict "$stage/tessera" --kube-version "$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$root/hack/k8s/go.mod")" >/dev/null
"$helm" package "$stage/tessera" --destination "$dist"
