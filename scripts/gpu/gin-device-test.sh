#!/usr/bin/env bash
# NCCL's device API (GIN) through railnet, and the same program with NCCL's own Socket transport, in one run.
# BINARY is railnet-gin-device-test (tests/gpu/gin_device_test.cu, built by scripts/gpu/build-gin-device-test.sh):
# it forks two ranks that look like two hosts (NCCL_HOSTID), so nNodes=2 and ncclDevCommCreate turns GIN on; on a
# one-GPU machine both ranks share the GPU: their kernels time-slice (correctness, not speed) unless MPS runs
# (nvidia-cuda-mps-control -d before, `echo quit | nvidia-cuda-mps-control` after), which lets them run at once.
#   (1) railnet: NCCL_NET_PLUGIN=the railnet .so; NCCL's INIT,NET log goes to OUT/railnet.nccl.<pid>.log, and its GIN
#       lines show which GIN backend NCCL assigned. Every check must pass (exit 0).
#   (2) Socket: NCCL_NET_PLUGIN=none NCCL_NET=Socket. Socket has no GIN backend, so ncclDevCommCreate must fail and
#       the program must print "GIN unavailable: ..." and exit 3.
#   scripts/gpu/gin-device-test.sh BINARY [ARGS...]     (ARGS go to both runs, e.g. --check --bench)
# PLUGIN   railnet's .so (default build/libnccl-net-railnet.so)
# NCCL_HOME the NCCL the binary was built against, 2.28.9 (default /usr/local/cuda-13.0; its lib goes first on
#          LD_LIBRARY_PATH)
# OUT      output directory (default out/gin-device-test)
set -euo pipefail
if [ $# -lt 1 ]; then sed -n '2,15p' "$0"; exit 2; fi
BIN=$(realpath "$1"); shift
here=$(dirname "$(realpath "$0")")
root=$(realpath "$here/../..")
PLUGIN=$(realpath "${PLUGIN:-$root/build/libnccl-net-railnet.so}")
PLUGIN_DIR=$(dirname "$PLUGIN")
NCCL_HOME=${NCCL_HOME:-/usr/local/cuda-13.0}
NCCL_LIB_DIR=${NCCL_LIB_DIR:-$NCCL_HOME/lib}
OUT=$(realpath -m "${OUT:-out/gin-device-test}")
source "$here/env.sh"        # NCCL_NVLS_ENABLE=0, transport_env
export NCCL_SOCKET_IFNAME=lo # both runs; railnet takes NCCL_SOCKET_IFNAME when RAILNET_IFNAME is unset
export LD_LIBRARY_PATH="$NCCL_LIB_DIR:$PLUGIN_DIR:${LD_LIBRARY_PATH:-}"
[ -e "$PLUGIN" ] || { echo "no railnet plugin at $PLUGIN (set PLUGIN=...)" >&2; exit 2; }
mkdir -p "$OUT"
rm -f "$OUT"/railnet.nccl.*.log "$OUT"/socket.nccl.*.log
summary="$OUT/summary.txt"
echo "# $(nvidia-smi -L | head -1 | cut -d'(' -f1)x$GPUS, $(nproc) cores, NCCL from $NCCL_LIB_DIR, plugin $PLUGIN" \
  > "$OUT/machine.txt"

# (1) railnet
railnet_status=0
# shellcheck disable=SC2046  # transport_env prints NAME=VALUE words on purpose
env $(transport_env railnet) NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$OUT/railnet.nccl.%p.log" \
  timeout 2400 "$BIN" "$@" 2>&1 | tee "$OUT/railnet.txt" || railnet_status=$?
passed=$(grep -c '^PASS' "$OUT/railnet.txt" || true)
failed=$(grep -c '^FAIL' "$OUT/railnet.txt" || true)

# (2) NCCL's Socket transport: must refuse GIN
socket_status=0
# shellcheck disable=SC2046
env $(transport_env socket) NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$OUT/socket.nccl.%p.log" \
  timeout 600 "$BIN" "$@" > "$OUT/socket.txt" 2>&1 || socket_status=$?
refusal=$(grep -m1 '^GIN unavailable' "$OUT/socket.txt" || true)

{
  echo "== railnet: exit $railnet_status, $passed PASS, $failed FAIL ($OUT/railnet.txt)"
  grep -h -m1 -o 'Using network.*' "$OUT"/railnet.nccl.*.log 2>/dev/null | sort -u | sed 's/^/    NCCL: /' || true
  echo "    GIN and one-sided lines of NCCL's log (count, text):"
  grep -h -E 'GIN|one-sided' "$OUT"/railnet.nccl.*.log 2>/dev/null | sed -E 's/^.*NCCL (INFO|WARN) //' | sort | uniq -c |
    head -20 | sed 's/^/    /' || true
  grep -h '^FAIL' "$OUT/railnet.txt" | head -10 | sed 's/^/    /' || true
  grep -h -E '^(gin_|sendrecv_)' "$OUT/railnet.txt" | sed 's/^/    /' || true
  echo "== Socket: exit $socket_status (expected 3: GIN unavailable) ($OUT/socket.txt)"
  echo "    ${refusal:-no 'GIN unavailable' line; last lines:}"
  [ -n "$refusal" ] || tail -5 "$OUT/socket.txt" | sed 's/^/    /'
} | tee "$summary"
if [ "$railnet_status" -eq 0 ] && [ "$socket_status" -eq 3 ]; then
  echo "PASS gin-device-test" | tee -a "$summary"
else
  echo "FAIL gin-device-test" | tee -a "$summary"
  exit 1
fi
