#!/usr/bin/env bash
# make kind-deploy: load the image into the kind nodes, apply manifests/ (or the kustomization
# KIND_MANIFESTS names, e.g. overlays/kube-scheduler-in-the-loop), wait until it serves.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

kind load docker-image "$IMAGE" --name "$KIND_CLUSTER"
$KUBECTL apply -k "$ROOT/${KIND_MANIFESTS:-manifests}"
if [ "$IMAGE" != "hami-py:dev" ]; then
  $KUBECTL -n hami-system set image deployment/hami-scheduler "hami-py=$IMAGE"
fi
# The certgen Job writes the serving certificate; the scheduler pod starts once it exists.
$KUBECTL -n hami-system wait --for=condition=complete job/hami-scheduler-certgen --timeout=180s
$KUBECTL -n hami-system rollout status deployment/hami-scheduler --timeout=180s
echo "hami-py is running in namespace hami-system (kubectl --context kind-$KIND_CLUSTER -n hami-system logs deploy/hami-scheduler -c hami-py)"
