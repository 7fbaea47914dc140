#!/usr/bin/env bash
# Rail check on one machine with 2 GPUs: two fake nodes x two GPUs (four processes, two per GPU, host ids
# fakehost0 and fakehost1), each node with two emulated NICs on loopback addresses (RAILNET_TCP_ADDRESSES:
# 127.0.1.1 = rail 0, 127.0.2.1 = rail 1). railnet places rail R next to GPU R in the NCCL topology it hands
# over. Stock nccl-tests run with data checking; railnet's per-NIC counters (logged when the last comm closes,
# one NCCL log per rank) show where every byte went (scripts/gpu/rail_counters.py).
#   scripts/gpu/rail-check.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR
# Phases (docs/topology.md, "Rail check"):
#   ncclsearch  NCCL's own ring search, all_reduce: reported, not judged (on this machine NCCL's search ends with
#               crossNic 0 at PHB, so a GPU also uses the other GPU's NIC; see the doc).
#   alternating ring collectives with the alternating ring (NCCL_GRAPH_FILE per node parity, rail_graph.py):
#               every rank's bytes on its own rail's NIC and no cross-rail connection.
#   p2p         alltoall and sendrecv: no connection crosses rails (railnet routes each to the peer's rail); bytes
#               on another rail's NIC must come from connections routed there.
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$(realpath -m "$3")
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
RANKS=4 RANKS_PER_HOST=2
source "$here/env.sh"
mkdir -p "$OUT"
summary="$OUT/rail-summary.txt"
: > "$summary"
failures=0
python3 "$here/rail_graph.py" --gpus 2 --parity even -o "$OUT/rail-graph-even.xml"
# With a GPU per rank, fake node 1 holds the machine's GPUs 2 and 3 (env.sh), which NCCL's graph files name by NVML
# index; with two GPUs both nodes share GPUs 0 and 1.
odd_first=0; [ "$GPUS" -ge 4 ] && odd_first=2
python3 "$here/rail_graph.py" --gpus 2 --parity odd --first-gpu "$odd_first" -o "$OUT/rail-graph-odd.xml"

# check PHASE NAME JUDGE ENV... -- BINARY: one nccl-tests run over the two rails; JUDGE is strict, local, routed or
# none.
check() {
  local phase=$1 coll=$2 judge=$3; shift 3
  local dir="$OUT/$phase/$coll"; mkdir -p "$dir"
  local status=0 verdict=0 wrong rows result
  mpirun_ranks RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1 NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH NCCL_DEBUG_FILE="$dir/nccl-rank{rank}.log" \
    NCCL_TOPO_DUMP_FILE="$dir/topo-dump.xml" NCCL_GRAPH_DUMP_FILE="$dir/graph-dump-rank2.xml" \
    NCCL_GRAPH_DUMP_FILE_RANK=2 "$@" -- \
    bash -c 'if [ -n "${RAIL_GRAPH_DIR:-}" ]; then
               parity=$(( (OMPI_COMM_WORLD_RANK / 2) % 2 ))
               if [ $parity -eq 0 ]; then export NCCL_GRAPH_FILE=$RAIL_GRAPH_DIR/rail-graph-even.xml
               else export NCCL_GRAPH_FILE=$RAIL_GRAPH_DIR/rail-graph-odd.xml; fi
             fi; exec "$@"' _ \
    "$TESTS/${coll}_perf" -b 8 -e 256M -f 4 -g 1 -c 1 -w 1 -n 3 > "$dir/stdout.log" 2>&1 || status=$?
  wrong=$(python3 "$here/nccl_tests_log.py" wrong "$dir/stdout.log")
  rows=$(python3 "$here/nccl_tests_log.py" rows "$dir/stdout.log")
  local mode=()
  [ "$judge" = local ] && mode=(--allow-cross-rail)
  [ "$judge" = routed ] && mode=(--routed)
  python3 "$here/rail_counters.py" "$dir" --ranks-per-host 2 "${mode[@]}" > "$dir/rails.txt" 2>&1 || verdict=$?
  [ "$judge" = none ] && verdict=0
  if [ "$status" -ne 0 ] || [ "$wrong" != "0" ] || [ "$rows" = "0" ] || [ "$verdict" -ne 0 ]; then
    failures=$((failures + 1)); result=FAIL
  else
    result=PASS
  fi
  [ "$judge" = none ] && result="$result (counters reported, not judged)"
  echo "$result $phase/$coll (exit $status, rows $rows, #wrong $wrong)" | tee -a "$summary"
  grep -h -m2 -o 'Pattern 4, crossNic [0-9]*.*' "$dir/nccl-rank0.log" | sed 's/^/    ring graph: /' | tee -a "$summary" || true
  grep -h -o 'Channel [0-9]*/[0-9]* : [0-9 ]*$' "$dir/nccl-rank0.log" | head -2 | sed 's/^/    /' | tee -a "$summary" || true
  sed 's/^/    /' "$dir/rails.txt" | tee -a "$summary"
}

check ncclsearch all_reduce none NCCL_ALGO=Ring
for coll in all_reduce all_gather reduce_scatter broadcast; do
  check alternating "$coll" strict NCCL_ALGO=Ring RAIL_GRAPH_DIR="$OUT"
done
# railnet routes each p2p connection to the peer's rail (RAILNET_FORWARD=1, the default): no connection crosses
# rails; bytes on another rail's NIC are those routed connections.
for coll in alltoall sendrecv; do
  check p2p "$coll" routed
done
echo "$failures failed" | tee -a "$summary"
exit $((failures > 0))
