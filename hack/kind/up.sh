#!/usr/bin/env bash
# make kind-up: create the kind cluster (kept if it already exists).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
  echo "kind cluster $KIND_CLUSTER already exists"
  exit 0
fi
kind create cluster --name "$KIND_CLUSTER" --image "$KIND_NODE_IMAGE" --config "$HERE/cluster.yaml" --wait 120s
