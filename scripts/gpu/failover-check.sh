#!/usr/bin/env bash
# Rail failover through stock NCCL (issue 20, docs/failover.md): two fake nodes x one GPU each (both on GPU 0 when the
# machine has one: correctness only), every rank with two emulated NICs on loopback addresses fused by NCCL
# (NCCL_NET_FORCE_MERGE -> railnet's makeVDevice). In the "cut" phase every fused send comm shuts NIC 1's data
# streams down once CUT_BYTES were queued on it (RAILNET_FAULT_NIC_CUT, standing in for the link: this machine has
# no ip or tc), railnet sends their chunks again over NIC 0, and probes NIC 1 back a second later. Stock nccl-tests
# check the data (-c 1): #wrong 0 and no NCCL error required, and the logs must show the failure and the failback.
# The same run without the cut is the reference.
# MODE single: the same two NICs, not fused (NCCL's channels each use one), and every send comm's own NIC is cut: each
# connection moves to the other NIC and back a second later (docs/failover.md "Single-NIC devices").
#   scripts/gpu/failover-check.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR [CUT_BYTES] [fused|single]
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$(realpath -m "$3"); CUT=${4:-67108864}; MODE=${5:-fused}
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
RANKS=2 RANKS_PER_HOST=1
source "$here/env.sh"
mkdir -p "$OUT"
summary="$OUT/failover-summary.txt"
: > "$summary"
nics=lo@127.0.1.1,lo@127.0.2.1
failures=0
case "$MODE" in
  fused) merge=(NCCL_NET_FORCE_MERGE="$nics"); cut_nic=1
         failed_pattern="the data streams of lo@127.0.2.1 failed"; back_pattern="lo@127.0.2.1 answers again" ;;
  single) merge=(); cut_nic=0
          failed_pattern="failed; the connection moves to another NIC"; back_pattern="answers again" ;;
  *) echo "MODE must be fused or single" >&2; exit 2 ;;
esac

# run PHASE COLL ENV...: one nccl-tests run over the two fused loopback NICs.
run() {
  local phase=$1 coll=$2; shift 2
  local dir="$OUT/$phase/$coll"; mkdir -p "$dir"
  local status=0 wrong rows verdict=0 result
  mpirun_ranks RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1 NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet \
    "${merge[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV \
    NCCL_DEBUG_FILE="$dir/nccl-rank{rank}.log" "$@" -- \
    "$TESTS/${coll}_perf" -b 8 -e 512M -f 4 -g 1 -c 1 -w 1 -n 5 > "$dir/stdout.log" 2>&1 || status=$?
  wrong=$(python3 "$here/nccl_tests_log.py" wrong "$dir/stdout.log")
  rows=$(python3 "$here/nccl_tests_log.py" rows "$dir/stdout.log")
  local failed answered
  failed=$(cat "$dir"/nccl-rank*.log | grep -c "$failed_pattern" || true)
  answered=$(cat "$dir"/nccl-rank*.log | grep -c "$back_pattern" || true)
  if [ "$phase" = cut ] && { [ "$failed" = 0 ] || [ "$answered" = 0 ]; }; then verdict=1; fi
  if [ "$phase" = reference ] && [ "$failed" != 0 ]; then verdict=1; fi
  if [ "$status" -ne 0 ] || [ "$wrong" != "0" ] || [ "$rows" = "0" ] || [ "$verdict" -ne 0 ]; then
    failures=$((failures + 1)); result=FAIL
  else
    result=PASS
  fi
  echo "$result $MODE $phase/$coll (exit $status, rows $rows, #wrong $wrong, NIC failures $failed, failbacks $answered)" \
    | tee -a "$summary"
  grep -h -m3 -E "Force-fusing|failed;|moved to|answers again" "$dir"/nccl-rank*.log | sed 's/^.*NET\/railnet: /    /' \
    | cut -c1-200 | tee -a "$summary" || true
  python3 "$here/nccl_tests_log.py" table "$dir/stdout.log" > "$dir/table.csv" || true
  awk -F, 'NR > 1 { print "    " $1 " B: busbw " $4 " GB/s" }' "$dir/table.csv" | tail -4 | tee -a "$summary"
}

for coll in all_reduce sendrecv; do
  run reference "$coll"
  run cut "$coll" RAILNET_FAULT_NIC_CUT=$cut_nic RAILNET_FAULT_NIC_CUT_BYTES="$CUT"
done
echo "$failures failed" | tee -a "$summary"
exit $((failures > 0))
