#!/usr/bin/env bash
# Correctness matrix on a GPU machine: stock nccl-tests through railnet with data checking on, 2 ranks as 2
# fake hosts. Every row must report #wrong = 0.
#   scripts/gpu/run-matrix.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR [--quick]
# NCCL_LIB_DIR picks the NCCL (default torch's pip NCCL; /usr/lib/x86_64-linux-gnu for the system one).
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$3; QUICK=${4:-}
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
source "$here/env.sh"
mkdir -p "$OUT"
max=1G; dtmax=16M
[ "$QUICK" = "--quick" ] && { max=64M; dtmax=1M; }
summary="$OUT/matrix-summary.txt"
: > "$summary"
failures=0

# run NAME ENV... -- BINARY ARGS...: one nccl-tests run through railnet, log kept, #wrong checked.
run() {
  local name=$1; shift
  local log="$OUT/$name.log"
  local status=0
  mpirun_ranks NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet NCCL_DEBUG=WARN "$@" > "$log" 2>&1 || status=$?
  local wrong
  wrong=$(python3 "$here/nccl_tests_log.py" wrong "$log")
  local rows
  rows=$(python3 "$here/nccl_tests_log.py" rows "$log")
  if [ "$status" -ne 0 ] || [ "$wrong" != "0" ] || [ "$rows" = "0" ]; then
    failures=$((failures + 1))
    echo "FAIL $name (exit $status, rows $rows, #wrong $wrong)" | tee -a "$summary"
  else
    echo "PASS $name (rows $rows, #wrong 0)" | tee -a "$summary"
  fi
}

nccl_version=$(python3 - "$NCCL_LIB_DIR/libnccl.so.2" <<'PY'
import ctypes, sys
version = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(version))
print(f"NCCL {version.value // 10000}.{version.value // 100 % 100}.{version.value % 100}")
PY
)
echo "# $nccl_version from $NCCL_LIB_DIR, plugin $PLUGIN, $RANKS ranks as $RANKS hosts" | tee -a "$summary"
common=(-b 8 -e "$max" -f 4 -g 1 -c 1 -w 2 -n 5)
for coll in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv; do
  run "$coll" -- "$TESTS/${coll}_perf" "${common[@]}"
done
run all_reduce_all_types -- "$TESTS/all_reduce_perf" -b 8 -e "$dtmax" -f 8 -g 1 -c 1 -w 1 -n 3 -d all -o sum
run all_reduce_all_ops -- "$TESTS/all_reduce_perf" -b 8 -e "$dtmax" -f 8 -g 1 -c 1 -w 1 -n 3 -d float -o all
for proto in LL LL128 Simple; do
  run "all_reduce_proto_$proto" NCCL_PROTO=$proto -- "$TESTS/all_reduce_perf" -b 8 -e 64M -f 8 -g 1 -c 1 -w 1 -n 3
done
for algo in Ring Tree; do
  run "all_reduce_algo_$algo" NCCL_ALGO=$algo -- "$TESTS/all_reduce_perf" -b 8 -e 64M -f 8 -g 1 -c 1 -w 1 -n 3
done
echo "$failures failed" | tee -a "$summary"
exit $((failures > 0))
