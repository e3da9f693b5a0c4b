#!/usr/bin/env bash
# Make kind nodes look like device nodes to hami-py, as the family's device plugin would.
# FAKE_DEVICE picks the family (default nvidia), as HAMi's NVIDIA device plugin would register:
#   hami.io/node-nvidia-register  the GPU inventory (JSON, one entry per GPU)
#   hami.io/node-handshake        "Reported <time>": the plugin is alive
#   status.capacity               nvidia.com/gpu = GPUs x split count (what the plugin advertises)
# Any other FAKE_DEVICE (ascend910b3, ascend910b4, ascend310p, mlu370, z100, kunlun, kunlun-vxpu,
# gcu, nvidia-h200, ...; `python -m hami_py.fakeapi.families --list`) takes the node patches from
# hami_py/fakeapi/families.py, the registrations the simulator and the tests use.
# Usage: fake-gpu-nodes.sh [node...]   (default: every node that is not a control plane)
# FAKE_GPUS (4 for nvidia; the model's own count, 8, otherwise), and for nvidia only
# FAKE_GPU_MODEL ("NVIDIA A10"), FAKE_GPU_MEMORY (MiB, 23028), FAKE_GPU_SPLIT (10).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

DEVICE="$FAKE_DEVICE"

GPUS="${FAKE_GPUS:-4}"
MODEL="${FAKE_GPU_MODEL:-NVIDIA A10}"
MEMORY="${FAKE_GPU_MEMORY:-23028}"
SPLIT="${FAKE_GPU_SPLIT:-10}"

gpu_uuid() {  # stable per node and index, shaped like a real one: GPU-8-4-4-4-12 hex digits
  printf '%s/gpu%s' "$1" "$2" | md5sum | sed -E 's/^(.{8})(.{4})(.{4})(.{4})(.{12}).*/GPU-\1-\2-\3-\4-\5/'
}

register_json() {
  local node="$1" i sep=""
  printf '['
  for ((i = 0; i < GPUS; i++)); do
    printf '%s{"id":"%s","index":%d,"count":%d,"devmem":%d,"devcore":100,"type":"%s","numa":0,"mode":"hami-core","health":true}' \
      "$sep" "$(gpu_uuid "$node" "$i")" "$i" "$SPLIT" "$MEMORY" "$MODEL"
    sep=","
  done
  printf ']'
}

if [ "$#" -gt 0 ]; then
  nodes=("$@")
else
  mapfile -t nodes < <($KUBECTL get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
fi

if [ "$DEVICE" != "nvidia" ]; then
  family_patch() {  # node, metadata|status: the kubectl merge patch the family's plugin amounts to
    families --family "$DEVICE" --node "$1" ${FAKE_GPUS:+--devices "$FAKE_GPUS"} --patch "$2"
  }
  family_patch probe metadata >/dev/null   # an unknown FAKE_DEVICE stops here, naming the known ones
  for node in "${nodes[@]}"; do
    $KUBECTL patch node "$node" --type=merge -p "$(family_patch "$node" metadata)" >/dev/null
    $KUBECTL patch node "$node" --subresource=status --type=merge -p "$(family_patch "$node" status)" >/dev/null
    echo "$node: registered as $DEVICE's device plugin would"
  done
  exit 0
fi

for node in "${nodes[@]}"; do
  $KUBECTL label node "$node" --overwrite gpu=on
  $KUBECTL annotate node "$node" --overwrite \
    "hami.io/node-nvidia-register=$(register_json "$node")" \
    "hami.io/node-handshake=Reported $(date '+%Y-%m-%d %H:%M:%S')"
  $KUBECTL patch node "$node" --subresource=status --type=merge \
    -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$((GPUS * SPLIT))\"}}}"
  echo "$node: $GPUS x $MODEL ($MEMORY MiB, split $SPLIT)"
done
