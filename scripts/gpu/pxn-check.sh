#!/usr/bin/env bash
# PXN and railnet's routing through stock NCCL: two fake nodes x two GPUs (four processes, host ids fakehost0 and
# fakehost1), each node with two loopback rails (RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1; rail R beside the
# node's GPU R). With four GPUs each process has its own GPU and each fake node sees only its two
# (scripts/gpu/env.sh); with two, the nodes share them (correctness only: kernels time-slice).
#   scripts/gpu/pxn-check.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR [PHASES]
# PHASES (default "correct shaped aggregate"):
#   correct    alltoall, sendrecv, all_reduce, all_gather with data checking (-c 1), 8 B-64 MiB, for railnet's
#              routing on/off (RAILNET_FORWARD) x NCCL's PXN on/off (NCCL_PXN_DISABLE). Every run must have
#              #wrong 0; with routing or PXN on, no connection may cross rails (railnet's per-NIC counters).
#   shaped     the same four variants on a shaped fabric (RAILNET_SHAPE_NIC_MBPS per rail, a spine at a quarter of
#              it: docs/fabric-shaping.md), alltoall and sendrecv 1 MiB-256 MiB, -c 0: busbw per variant.
#   aggregate  alltoall 8 B-64 MiB, 50 timed iterations, NCCL's PXN on (PXN is what makes NCCL post grouped
#              receives), with the fake nodes on the same GPU numbers (AGG_SHARE_GPUS=0 to not): aggregation on
#              (RAILNET_MAX_RECVS=8, RAILNET_GROUP_WAIT_US=20), members sent one by one (GROUP_WAIT_US=0), and no
#              grouped receives (RAILNET_MAX_RECVS=1). Copies in the application's CUDA context
#              (RAILNET_TCP_OWN_COPY_CONTEXT=0; AGG_OWN_CONTEXT=1 to not, e.g. under MPS), since GPU memory on TCP
#              is on and railnet's own context would make every small message wait 2.4 ms without MPS (D70).
#              AGG_EXTRA adds variables to every run, e.g. NCCL_MAX_P2P_NCHANNELS=1: NCCL groups only receives
#              of one channel that come through one remote proxy, and with two GPUs per node it spreads the two
#              senders over different channels unless told to use one.
# Summary: OUT/pxn-summary.txt; per run: stdout.log, nccl-rank<R>.log, rails.txt (scripts/gpu/rail_counters.py).
# CORRECT_COLLS picks the correct phase's collectives. SHAPE_NIC_MBPS (default 25000) sets the rail rate of the shaped phase. Every run offers NCCL GPU memory
# (RAILNET_TCP_GPU=1; PXN_GPU=0 to not): NCCL turns PXN on only where the net takes GPU memory.
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$(realpath -m "$3"); PHASES=${4:-correct shaped aggregate}
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
RANKS=4 RANKS_PER_HOST=2
source "$here/env.sh"
mkdir -p "$OUT"
summary="$OUT/pxn-summary.txt"
echo "# $(nvidia-smi -L | head -1 | cut -d'(' -f1)x$GPUS GPUs, 4 ranks as 2 fake nodes x 2, $(nproc) cores" >> "$summary"
nic_mbps=${SHAPE_NIC_MBPS:-25000}
failures=0

# variant_env NAME: the environment of a variant named fwd<0|1>-pxn<0|1>.
variant_env() {
  local forward=${1#fwd}; forward=${forward%%-*}
  local pxn=${1##*pxn}
  echo "RAILNET_FORWARD=$forward NCCL_PXN_DISABLE=$((1 - pxn)) RAILNET_TCP_GPU=${PXN_GPU:-1}"
}

# run DIR JUDGE ENV... -- NCCL_TESTS_ARGS...: one nccl-tests run over the two rails of each node.
# JUDGE: nocross (no connection may cross rails), any (cross-rail connections reported only).
run() {
  local dir=$1 judge=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local coll=$1; shift
  mkdir -p "$dir"
  local status=0 wrong rows cross routed busbw result
  # shellcheck disable=SC2086
  mpirun_ranks RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1 NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH,PROXY NCCL_DEBUG_FILE="$dir/nccl-rank{rank}.log" "${envs[@]}" -- \
    "$TESTS/${coll}_perf" "$@" > "$dir/stdout.log" 2>&1 || status=$?
  wrong=$(python3 "$here/nccl_tests_log.py" wrong "$dir/stdout.log")
  rows=$(python3 "$here/nccl_tests_log.py" rows "$dir/stdout.log")
  python3 "$here/rail_counters.py" "$dir" --ranks-per-host 2 --allow-cross-rail > "$dir/rails.txt" 2>&1 || true
  cross=$(grep -h -o '[0-9]* cross-rail connection(s)' "$dir/rails.txt" | awk '{s += $1} END {print s + 0}')
  routed=$(grep -h -o '[0-9]* routed here' "$dir"/nccl-rank*.log 2>/dev/null | awk '{s += $1} END {print s + 0}')
  busbw=$(python3 "$here/nccl_tests_log.py" table "$dir/stdout.log" | tail -1 | awk -F, '{print $NF}')
  result=PASS
  if [ "$status" -ne 0 ] || [ "$wrong" != "0" ] || [ "$rows" = "0" ]; then result=FAIL; fi
  if [ "$judge" = nocross ] && [ "$cross" != "0" ]; then result=FAIL; fi
  [ "$result" = FAIL ] && failures=$((failures + 1))
  # NCCL names the proxy rank of a PXN send in parentheses: "[send] via NET/railnet/1(1)/GDRDMA".
  local pxn_sends
  pxn_sends=$(cat "$dir"/nccl-rank*.log 2>/dev/null | grep -c 'send\] via NET/railnet/[0-9]*([0-9]*)' || true)
  printf '%s %-36s exit %s rows %s #wrong %s cross-rail %s routed %s pxn-sends %s last-busbw %s\n' \
    "$result" "${dir#"$OUT"/}" "$status" "$rows" "$wrong" "$cross" "$routed" "$pxn_sends" "$busbw" | tee -a "$summary"
}

for phase in $PHASES; do
  case "$phase" in
    correct)
      for variant in fwd1-pxn1 fwd0-pxn1 fwd1-pxn0 fwd0-pxn0; do
        judge=nocross; [ "$variant" = fwd0-pxn0 ] && judge=any
        for coll in ${CORRECT_COLLS:-alltoall sendrecv all_reduce all_gather}; do
          # shellcheck disable=SC2046
          run "$OUT/correct/$variant/$coll" "$judge" $(variant_env "$variant") -- \
            "$coll" -b 8 -e 64M -f 4 -g 1 -c 1 -w 1 -n 3
        done
      done ;;
    shaped)
      for coll in alltoall sendrecv; do
        for variant in fwd1-pxn1 fwd0-pxn1 fwd1-pxn0 fwd0-pxn0; do
          # shellcheck disable=SC2046
          run "$OUT/shaped/$coll/$variant" any $(variant_env "$variant") RAILNET_SHAPE_NIC_MBPS="$nic_mbps" \
            RAILNET_SHAPE_SPINE_MBPS=$((nic_mbps / 4)) -- "$coll" -b 1M -e 256M -f 4 -g 1 -c 0 -w 2 -n 5
        done
      done ;;
    aggregate)
      # Both fake nodes on GPUs 0 and 1 (env.sh, FAKE_NODES_SHARE_GPUS): the shape where NCCL's send/recv PXN, and
      # with it grouped receives, can happen at all.
      for variant in max-recvs-8 group-wait-0 max-recvs-1; do
        case "$variant" in
          max-recvs-8) agg_env=(RAILNET_MAX_RECVS=8 RAILNET_GROUP_WAIT_US=20) ;;
          group-wait-0) agg_env=(RAILNET_MAX_RECVS=8 RAILNET_GROUP_WAIT_US=0) ;;
          max-recvs-1) agg_env=(RAILNET_MAX_RECVS=1) ;;
        esac
        # shellcheck disable=SC2086
        FAKE_NODES_SHARE_GPUS=${AGG_SHARE_GPUS:-1} run "$OUT/aggregate/$variant" nocross "${agg_env[@]}" ${AGG_EXTRA:-} \
          NCCL_PXN_DISABLE=0 RAILNET_TCP_GPU="${PXN_GPU:-1}" RAILNET_TCP_OWN_COPY_CONTEXT="${AGG_OWN_CONTEXT:-0}" -- \
          alltoall -b 8 -e 64M -f 4 -g 1 -c 1 -w 5 -n 50
        # What NCCL posted (grouped receives and their buffers) and what railnet's senders held and carried together.
        grep -h -o 'took [0-9]* grouped receives of [0-9]* buffers' "$OUT/aggregate/$variant"/nccl-rank*.log \
          2>/dev/null | awk -v v="$variant" '{g += $2; b += $6} END {printf "  %s: NCCL posted %d grouped receives of %d buffers\n", v, g, b}' \
          | tee -a "$summary" || true
        grep -h -o 'carried [0-9]* members of grouped receives in [0-9]* [a-z]*' "$OUT/aggregate/$variant"/nccl-rank*.log \
          2>/dev/null | awk -v v="$variant" '{m += $2; w += $8} END {printf "  %s: %d grouped members in %d transfers\n", v, m, w}' \
          | tee -a "$summary" || true
      done ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
echo "$failures failed" | tee -a "$summary"
exit $((failures > 0))
