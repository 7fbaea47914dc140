#!/usr/bin/env bash
# The alternating-ring all-reduce on railnet's GPU doorbells against ncclAllReduce through railnet, in one run
# (railnet-doorbell-allreduce, tests/gpu/doorbell_allreduce.cu, built by scripts/gpu/build-doorbell-allreduce.sh).
# The binary forks its ranks (default 4, 2 per fake node: NCCL_HOSTID), checks both results bitwise against each
# other and the closed form (PASS/FAIL rN allreduce_<size>MiB), and rank 0 prints one line per size:
# "allreduce <size> MiB: doorbell_ring <busbw> (<us>), nccl <busbw> (<us>), ratio <doorbell/nccl>".
#   scripts/gpu/doorbell-allreduce.sh BINARY [ARGS...]   (ARGS go to the binary, e.g. --ranks 4 --gpus-per-node 2
#                                                         --sizes 1,16,64,256 --intra nvlink)
# PLUGIN       railnet's .so (default build/libnccl-net-railnet.so): NCCL_NET_PLUGIN (NCCL_NET=railnet unless set,
#              so NCCL fails rather than fall back to its Socket transport) and RAILNET_PLUGIN (the doorbell API)
# NCCL_HOME    the NCCL the binary was built against (default /usr/local/cuda-13.0); NCCL_LIB_DIR (default
#              $NCCL_HOME/lib) goes first on LD_LIBRARY_PATH
# OUT          output directory (default out/doorbell-allreduce): allreduce.txt is the whole output
# Exit status: the binary's (0 all passed, 1 a check or a device call failed, 2 an error or a hang).
# With fewer GPUs than ranks, ranks share GPUs and their kernels time-slice (checks only; start MPS for timings:
# nvidia-cuda-mps-control -d before, `echo quit | nvidia-cuda-mps-control` after).
set -euo pipefail
if [ $# -lt 1 ]; then sed -n '2,17p' "$0"; exit 2; fi
BIN=$(realpath "$1"); shift
here=$(dirname "$(realpath "$0")")
root=$(realpath "$here/../..")
PLUGIN=$(realpath "${PLUGIN:-$root/build/libnccl-net-railnet.so}")
NCCL_HOME=${NCCL_HOME:-/usr/local/cuda-13.0}
NCCL_LIB_DIR=${NCCL_LIB_DIR:-$NCCL_HOME/lib}
OUT=$(realpath -m "${OUT:-out/doorbell-allreduce}")
[ -e "$PLUGIN" ] || { echo "no railnet plugin at $PLUGIN (set PLUGIN=...)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "no binary at $BIN (scripts/gpu/build-doorbell-allreduce.sh builds it)" >&2; exit 2; }
mkdir -p "$OUT"
export NCCL_NET_PLUGIN=$PLUGIN RAILNET_PLUGIN=$PLUGIN
export NCCL_NET=${NCCL_NET:-railnet}
export NCCL_SOCKET_IFNAME=lo    # railnet takes it when RAILNET_IFNAME is unset
export NCCL_NVLS_ENABLE=0       # required on the shared GPU machines
PLUGIN_DIR=$(dirname "$PLUGIN")
export LD_LIBRARY_PATH="$NCCL_LIB_DIR:$PLUGIN_DIR:${LD_LIBRARY_PATH:-}"
echo "# $(nvidia-smi -L 2>/dev/null | head -1 | cut -d'(' -f1)x$(nvidia-smi -L 2>/dev/null | wc -l), $(nproc) cores," \
  "NCCL from $NCCL_LIB_DIR, plugin $PLUGIN" | tee "$OUT/machine.txt"
status=0
"$BIN" "$@" 2>&1 | tee "$OUT/allreduce.txt" || status=${PIPESTATUS[0]}
echo "== exit $status, $(grep -c '^PASS' "$OUT/allreduce.txt" || true) PASS, $(grep -c '^FAIL' "$OUT/allreduce.txt" || true) FAIL ($OUT/allreduce.txt)"
exit "$status"
