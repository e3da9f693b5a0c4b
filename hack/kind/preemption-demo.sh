#!/usr/bin/env bash
# Device preemption on kind: a low-priority batch pod takes every GPU of hami-py-worker, then a
# high-priority pod for that worker arrives. hami-py (--device-preemption) evicts the batch pod
# through the Eviction API, holds the GPU for the urgent pod, and places it once the batch pod is
# gone. Needs make kind-up and make kind-deploy first; turns --device-preemption on in the
# Deployment when it is not (overlays/kube-scheduler-in-the-loop has it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
NS=hami-demo
EXAMPLES="$ROOT/manifests/examples/preemption"

args="$($KUBECTL -n hami-system get deployment hami-scheduler -o jsonpath='{.spec.template.spec.containers[?(@.name=="hami-py")].args}')"
if [[ "$args" != *--device-preemption* ]]; then
  index="$($KUBECTL -n hami-system get deployment hami-scheduler -o json | "$KIND_PYTHON" -c \
    'import json,sys; c=json.load(sys.stdin)["spec"]["template"]["spec"]["containers"]; print([x["name"] for x in c].index("hami-py"))')"
  $KUBECTL -n hami-system patch deployment hami-scheduler --type=json -p \
    "[{\"op\":\"add\",\"path\":\"/spec/template/spec/containers/$index/args/-\",\"value\":\"--device-preemption\"}]"
  $KUBECTL -n hami-system rollout status deployment hami-scheduler --timeout=120s
fi

FAKE_GPUS=4 "$HERE/fake-gpu-nodes.sh" hami-py-worker
$KUBECTL create namespace "$NS" --dry-run=client -o yaml | $KUBECTL apply -f -
$KUBECTL apply -f "$EXAMPLES/priority-classes.yaml"

finish_allocation() {  # what HAMi's device plugin does once it handed the GPUs to the pod
  local pod="$1" node="$2" lock
  $KUBECTL -n "$NS" annotate pod "$pod" --overwrite hami.io/bind-phase=success >/dev/null
  lock="$($KUBECTL get node "$node" -o jsonpath='{.metadata.annotations.hami\.io/mutex\.lock}')"
  if [[ "$lock" == *",$NS,$pod" ]]; then
    $KUBECTL annotate node "$node" hami.io/mutex.lock- >/dev/null
  fi
}

wait_bound() {  # pod: wait until it is bound, finish its allocation, print its node
  local pod="$1" node="" deadline=$((SECONDS + 120))
  while [ -z "$node" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      $KUBECTL -n "$NS" describe pod "$pod" >&2
      return 1
    fi
    sleep 1
    node="$($KUBECTL -n "$NS" get pod "$pod" -o jsonpath='{.spec.nodeName}' 2>/dev/null || true)"
  done
  finish_allocation "$pod" "$node"
  echo "$pod -> $node"
}

$KUBECTL apply -f "$EXAMPLES/batch.yaml"
wait_bound batch-trainer
$KUBECTL apply -f "$EXAMPLES/urgent.yaml"
wait_bound urgent-inference
echo
echo "batch-trainer: $($KUBECTL -n "$NS" get pod batch-trainer -o name 2>/dev/null || echo evicted)"
$KUBECTL -n "$NS" get events --field-selector reason=Preempted -o custom-columns='OBJECT:.involvedObject.name,MESSAGE:.message'
