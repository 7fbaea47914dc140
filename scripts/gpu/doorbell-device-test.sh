#!/usr/bin/env bash
# railnet's own GPU doorbells driven by kernels (railnet-doorbell-device-test, built by
# scripts/gpu/build-doorbell-device-test.sh), and, in the same run when GIN_BINARY is given, NCCL's GIN proxy path
# through railnet (railnet-gin-device-test --bench), so the two round trips are measured side by side.
#   scripts/gpu/doorbell-device-test.sh BINARY [ARGS...]      (ARGS go to the doorbell test, e.g. --check --bench)
# PLUGIN      railnet's .so (default build/libnccl-net-railnet.so)
# GIN_BINARY  railnet-gin-device-test (optional); NCCL_HOME the NCCL it was built against (its lib goes first)
# OUT         output directory (default out/doorbell-device-test)
# Two GPUs give each rank its own; on one GPU the ranks share it (run MPS for timings: see gin-device-test.sh).
set -euo pipefail
if [ $# -lt 1 ]; then sed -n '2,9p' "$0"; exit 2; fi
BIN=$(realpath "$1"); shift
here=$(dirname "$(realpath "$0")")
root=$(realpath "$here/../..")
PLUGIN=$(realpath "${PLUGIN:-$root/build/libnccl-net-railnet.so}")
OUT=$(realpath -m "${OUT:-out/doorbell-device-test}")
[ -e "$PLUGIN" ] || { echo "no railnet plugin at $PLUGIN (set PLUGIN=...)" >&2; exit 2; }
mkdir -p "$OUT"
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}  # railnet takes it when RAILNET_IFNAME is unset
echo "# $(nvidia-smi -L | head -1 | cut -d'(' -f1)x$(nvidia-smi -L | wc -l), $(nproc) cores, plugin $PLUGIN" \
  | tee "$OUT/machine.txt"

status=0
RAILNET_PLUGIN=$PLUGIN timeout 900 "$BIN" "$@" > "$OUT/doorbell.txt" 2> "$OUT/doorbell.stderr" || status=$?
echo "== doorbells: exit $status, $(grep -c '^PASS' "$OUT/doorbell.txt" || true) PASS, $(grep -c '^FAIL' "$OUT/doorbell.txt" || true) FAIL ($OUT/doorbell.txt)"
grep -E '^(FAIL|doorbell_|#)' "$OUT/doorbell.txt" | sed 's/^/    /' || true
tail -5 "$OUT/doorbell.stderr" | sed 's/^/    stderr: /'

if [ -n "${GIN_BINARY:-}" ]; then
  gin_status=0
  OUT=$OUT/gin PLUGIN=$PLUGIN "$here/gin-device-test.sh" "$GIN_BINARY" --bench --timeout-s 30 --watchdog-s 300 \
    > "$OUT/gin.txt" 2>&1 || gin_status=$?
  echo "== NCCL GIN proxy through railnet (railnet-gin-device-test --bench): exit $gin_status ($OUT/gin.txt)"
  grep -E '^(gin_|sendrecv_)' "$OUT/gin/railnet.txt" | awk '!seen[$0]++' | sed 's/^/    /' || true
  db=$(sed -n 's/^doorbell_signal_roundtrip_us median [0-9.]* mean \([0-9.]*\).*/\1/p' "$OUT/doorbell.txt")
  gin=$(sed -n 's/^gin_signal_roundtrip_us \([0-9.]*\).*/\1/p' "$OUT/gin/railnet.txt" | head -1)
  if [ -n "$db" ] && [ -n "$gin" ]; then
    echo "    signal round trip (means), doorbells / GIN proxy: $db / $gin us = $(python3 -c "print(f'{$db/$gin:.3f}')")"
  fi
fi
exit "$status"
