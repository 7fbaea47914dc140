#!/usr/bin/env bash
# Rail check on one machine with 2 GPUs: two fake nodes x two GPUs (four processes, two per GPU, host ids
# fakehost0 and fakehost1), each node with two emulated NICs on loopback addresses (127.0.1.1 = rail 0,
# 127.0.2.1 = rail 1). railnet places rail R next to GPU R in the NCCL topology it hands over, so NCCL should
# keep every GPU's inter-node traffic on the NIC of its own rail. Stock nccl-tests run with data checking, and
# railnet's per-NIC counters (logged when the last comm closes) prove where the bytes went.
#   scripts/gpu/rail-check.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$3
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
RANKS=4 RANKS_PER_HOST=2
source "$here/env.sh"
mkdir -p "$OUT"
summary="$OUT/rail-summary.txt"
: > "$summary"
failures=0
rails=(RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1 NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet
       NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH)
for coll in all_reduce all_gather reduce_scatter alltoall sendrecv; do
  dir="$OUT/$coll"; mkdir -p "$dir"
  status=0
  mpirun_ranks "${rails[@]}" NCCL_DEBUG_FILE="$dir/nccl-rank{rank}.log" \
    NCCL_TOPO_DUMP_FILE="$dir/topo-dump.xml" -- \
    "$TESTS/${coll}_perf" -b 8 -e 256M -f 4 -g 1 -c 1 -w 1 -n 3 > "$dir/stdout.log" 2>&1 || status=$?
  wrong=$(python3 "$here/nccl_tests_log.py" wrong "$dir/stdout.log")
  rows=$(python3 "$here/nccl_tests_log.py" rows "$dir/stdout.log")
  verdict=0
  python3 "$here/rail_counters.py" "$dir" --ranks-per-host 2 > "$dir/rails.txt" 2>&1 || verdict=$?
  if [ "$status" -ne 0 ] || [ "$wrong" != "0" ] || [ "$rows" = "0" ] || [ "$verdict" -ne 0 ]; then
    failures=$((failures + 1)); result=FAIL
  else
    result=PASS
  fi
  echo "$result $coll (exit $status, rows $rows, #wrong $wrong)" | tee -a "$summary"
  sed 's/^/    /' "$dir/rails.txt" | tee -a "$summary"
done
echo "$failures failed" | tee -a "$summary"
exit $((failures > 0))
