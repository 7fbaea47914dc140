#!/usr/bin/env bash
# railnet against NCCL's own Socket transport, in the same run on the same machine: one size sweep per collective
# and transport, and railnet/best-Socket ratio tables (scripts/gpu/compare.py) plus CSVs.
#   scripts/gpu/bench-vs-socket.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR [MAX_SIZE]
# COLLS (default "all_reduce alltoall sendrecv") and TRANSPORTS (default "railnet socket4x4 socket"; words of
# transport_env in env.sh, e.g. add socket4x4ch8 and railnet-notuner) choose what runs. ITERS (default 10) and
# WARMUP (default 3) are nccl-tests' -n and -w.
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$3; MAX=${4:-1G}
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
source "$here/env.sh"
mkdir -p "$OUT"
echo "# $(nvidia-smi -L | head -1 | cut -d'(' -f1)x$RANKS, $(nproc) cores, NCCL from $NCCL_LIB_DIR" > "$OUT/machine.txt"
for transport in ${TRANSPORTS:-railnet socket4x4 socket}; do
  for coll in ${COLLS:-all_reduce alltoall sendrecv}; do
    log="$OUT/${coll}-${transport}.log"
    # shellcheck disable=SC2046  # transport_env prints NAME=VALUE words on purpose
    # NCCL's log goes to its own files (railnet's CPU-per-GB line is read from them), keeping stdout's rows whole.
    mpirun_ranks $(transport_env "$transport") NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET \
      NCCL_DEBUG_FILE="$OUT/${coll}-${transport}.nccl.%p" -- \
      "$TESTS/${coll}_perf" -b 8 -e "$MAX" -f 4 -g 1 -c 0 -w "${WARMUP:-3}" -n "${ITERS:-10}" > "$log" 2>&1
    python3 "$here/nccl_tests_log.py" table "$log" > "$OUT/${coll}-${transport}.csv"
    echo "done $coll $transport" >&2
  done
done
python3 "$here/compare.py" "$OUT" | tee "$OUT/ratios.md"
