#!/usr/bin/env bash
# Regenerate the Python code for the kubelet plugin .proto files in dra_driver/proto.
# Usage: hack/gen-proto.sh [output-root]   (default: the repository root, i.e. in place)
# The unit test tests/unit/dra_driver/test_proto.py runs this into a temp dir and compares.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_root="${1:-$repo_root}"
python="${PYTHON:-$repo_root/.venv/bin/python}"
cd "$repo_root"
mkdir -p "$out_root/dra_driver/proto"
# Paths are given relative to the repository root so the generated imports are package-absolute
# (from dra_driver.proto import x_pb2) rather than top-level.
"$python" -m grpc_tools.protoc -I . \
  --python_out="$out_root" --pyi_out="$out_root" --grpc_python_out="$out_root" \
  dra_driver/proto/*.proto
