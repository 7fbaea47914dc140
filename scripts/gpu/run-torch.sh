#!/usr/bin/env bash
# The torch job through railnet and through NCCL's Socket transport; their loss curves must agree.
#   scripts/gpu/run-torch.sh PLUGIN_SO OUT_DIR
set -euo pipefail
PLUGIN=$(realpath "$1"); OUT=$2
here=$(dirname "$(realpath "$0")")
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo  # railnet takes NCCL_SOCKET_IFNAME when RAILNET_IFNAME is unset
# One rank per GPU, at least two (on a one-GPU machine both share it: correctness, not speed); RANKS=N for fewer.
# With two ranks every all-reduce sums two values, so the loss curves must match to the last digit; with more,
# a different reduction order (ring vs tree, channel count) may round differently.
ranks=${RANKS:-$(nvidia-smi -L | wc -l)}
[ "$ranks" -lt 2 ] && ranks=2
launch() {
  python3 -m torch.distributed.run --nproc_per_node="$ranks" --master_port=29533 \
    "$here/torch_check.py" --out "$1"
}
NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT launch "$OUT/losses-railnet.json" \
  > "$OUT/torch-railnet.log" 2>&1 || { tail -30 "$OUT/torch-railnet.log"; exit 1; }
grep -m1 "NET/railnet: railnet" "$OUT/torch-railnet.log" || { echo "railnet was not loaded"; exit 1; }
NCCL_NET_PLUGIN=none NCCL_NET=Socket launch "$OUT/losses-socket.json" > "$OUT/torch-socket.log" 2>&1 ||
  { tail -30 "$OUT/torch-socket.log"; exit 1; }
python3 - "$OUT/losses-railnet.json" "$OUT/losses-socket.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["losses"]
b = json.load(open(sys.argv[2]))["losses"]
worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
print(f"railnet vs Socket: {len(a)} steps, loss {a[0]:.5f} -> {a[-1]:.5f}, max relative difference {worst:.2e}")
sys.exit(0 if len(a) == len(b) and worst < 1e-5 else 1)
PY
