#!/usr/bin/env bash
# make kind-demo: fake GPU nodes, then GPU pods created with the default scheduler. The webhook
# hands them to hami-scheduler, hami-py picks node and GPUs, and this script plays the device
# plugin's last step (bind-phase success, node lock released). Prints where each pod landed.
# FAKE_DEVICE=ascend910b3|mlu370|kunlun|... fakes another family instead (see fake-gpu-nodes.sh)
# and creates that family's demo pods (hami_py/fakeapi/families.py); default nvidia.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
NS=hami-demo

"$HERE/fake-gpu-nodes.sh"
$KUBECTL create namespace "$NS" --dry-run=client -o yaml | $KUBECTL apply -f -

gpu_pod() {  # name, GPUs, extra limit lines
  cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $NS
spec:
  containers:
    - name: main
      image: registry.k8s.io/pause:3.10
      resources:
        limits:
          nvidia.com/gpu: "$2"
$3
YAML
}

finish_allocation() {  # what HAMi's device plugin does once it handed the GPUs to the pod
  local pod="$1" node="$2" lock
  $KUBECTL -n "$NS" annotate pod "$pod" --overwrite hami.io/bind-phase=success >/dev/null
  lock="$($KUBECTL get node "$node" -o jsonpath='{.metadata.annotations.hami\.io/mutex\.lock}')"
  if [[ "$lock" == *",$NS,$pod" ]]; then
    $KUBECTL annotate node "$node" hami.io/mutex.lock- >/dev/null
  fi
  if [ "$FAKE_DEVICE" = "mlu370" ]; then   # Cambricon's plugin frees its own lock (a bare timestamp)
    $KUBECTL annotate node "$node" cambricon.com/dsmlu.lock- >/dev/null 2>&1 || true
  fi
}

schedule() {  # create one pod and wait until hami-py bound it
  local pod="$1" node="" deadline=$((SECONDS + 60))
  if [ -n "${POD_JSON:-}" ]; then
    printf '%s' "$POD_JSON" | $KUBECTL apply -f - >/dev/null
  else
    gpu_pod "$@" | $KUBECTL apply -f - >/dev/null
  fi
  while [ -z "$node" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$pod was not scheduled within 60 s:" >&2
      $KUBECTL -n "$NS" describe pod "$pod" >&2
      return 1
    fi
    sleep 1
    node="$($KUBECTL -n "$NS" get pod "$pod" -o jsonpath='{.spec.nodeName}')"
  done
  finish_allocation "$pod" "$node"
  echo "$pod -> $node"
}

if [ "$FAKE_DEVICE" != "nvidia" ]; then
  # The family's demo pods, as a user would write them (no scheduler name: the webhook assigns it).
  while IFS=$'\t' read -r name json; do
    POD_JSON="$json" schedule "$name"
  done < <(families --family "$FAKE_DEVICE" --demo-pods "$NS")
  echo
  $KUBECTL -n "$NS" get pods -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,SCHEDULER:.spec.schedulerName'
  exit 0
fi

schedule vgpu-3g 1 '          nvidia.com/gpumem: "3000"'
schedule vgpu-8g-half-cores 1 '          nvidia.com/gpumem: "8000"
          nvidia.com/gpucores: "50"'
schedule vgpu-two-cards 2 '          nvidia.com/gpumem-percentage: "25"'
schedule whole-card 1 ''

echo
echo "A privileged GPU pod is refused by the webhook:"
gpu_pod privileged-gpu 1 '      securityContext:
        privileged: true' | $KUBECTL apply -f - 2>&1 | sed 's/^/  /' || true

echo
$KUBECTL -n "$NS" get pods -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,SCHEDULER:.spec.schedulerName,GPUS:.metadata.annotations.hami\.io/vgpu-devices-allocated'
