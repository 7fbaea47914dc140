#!/usr/bin/env bash
# NIC fusion through stock NCCL on one machine with 2 GPUs: two fake nodes x one GPU, each with two emulated
# NICs on loopback addresses (RAILNET_TCP_ADDRESSES: 127.0.1.1, 127.0.2.1). NCCL_NET_FORCE_MERGE makes NCCL
# call railnet's makeVDevice and use the fused device; stock nccl-tests check the data, and railnet's per-NIC
# counters (one NCCL log per rank) must show every rank's bytes spread over both NICs. The same run without
# fusion is kept for comparison (bandwidth over loopback is not judged: both "NICs" are one kernel path).
#   scripts/gpu/fusion-check.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$(realpath -m "$3")
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
RANKS=2 RANKS_PER_HOST=1
source "$here/env.sh"
mkdir -p "$OUT"
summary="$OUT/fusion-summary.txt"
: > "$summary"
nics=lo@127.0.1.1,lo@127.0.2.1
failures=0

# run PHASE COLL ENV...: one nccl-tests run over the two loopback NICs.
run() {
  local phase=$1 coll=$2; shift 2
  local dir="$OUT/$phase/$coll"; mkdir -p "$dir"
  local status=0 wrong rows
  mpirun_ranks RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1 NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV NCCL_DEBUG_FILE="$dir/nccl-rank{rank}.log" "$@" -- \
    "$TESTS/${coll}_perf" -b 8 -e 256M -f 4 -g 1 -c 1 -w 1 -n 5 > "$dir/stdout.log" 2>&1 || status=$?
  wrong=$(python3 "$here/nccl_tests_log.py" wrong "$dir/stdout.log")
  rows=$(python3 "$here/nccl_tests_log.py" rows "$dir/stdout.log")
  local verdict=0 result
  if [ "$phase" = fused ]; then
    python3 "$here/fusion_counters.py" "$dir" --nics "$nics" > "$dir/counters.txt" 2>&1 || verdict=$?
    # NCCL must have fused, and through railnet: its own line and a channel over the virtual device.
    grep -q "Force-fusing NICs" "$dir/nccl-rank0.log" || verdict=1
  else
    python3 "$here/fusion_counters.py" "$dir" --nics "$nics" --min-share 0 > "$dir/counters.txt" 2>&1 || true
  fi
  if [ "$status" -ne 0 ] || [ "$wrong" != "0" ] || [ "$rows" = "0" ] || [ "$verdict" -ne 0 ]; then
    failures=$((failures + 1)); result=FAIL
  else
    result=PASS
  fi
  [ "$phase" = fused ] || result="$result (reference)"
  echo "$result $phase/$coll (exit $status, rows $rows, #wrong $wrong)" | tee -a "$summary"
  grep -h -m3 -E "Force-fusing|makeVDevice|NET/railnet: railnet .* device" "$dir/nccl-rank0.log" | sed 's/^.*NCCL INFO /    /' \
    | tee -a "$summary" || true
  grep -h -m2 -E "via NET/railnet/[0-9]+" "$dir/nccl-rank0.log" | sed 's/^.*NCCL INFO /    /' | tee -a "$summary" || true
  sed 's/^/    /' "$dir/counters.txt" | tee -a "$summary"
  python3 "$here/nccl_tests_log.py" table "$dir/stdout.log" \
    | awk -F, 'NR > 1 { last = $0; size = $1; bw = $4 } END { if (last) print "    busbw at the largest size (" size " B): " bw " GB/s (out of place)" }' \
    | tee -a "$summary"
}

for coll in all_reduce sendrecv; do
  run single "$coll"
  run fused "$coll" NCCL_NET_FORCE_MERGE="$nics"
done
echo "$failures failed" | tee -a "$summary"
exit $((failures > 0))
