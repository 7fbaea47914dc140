#!/usr/bin/env bash
# Alternating (rail-aligned) ring check on one GPU machine: 2 fake nodes x 2 GPUs (4 processes), through railnet.
#   scripts/gpu/tuner-ring-check.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR
# 1. NCCL's own ring: all_reduce with data checking, NCCL_GRAPH_DUMP_FILE from rank 0 (even node).
# 2. From that dump, ring-even.xml (the ring graph as NCCL found it) and ring-odd.xml (each channel's GPUs
#    reversed), handed per node parity through NCCL_GRAPH_FILE: even nodes walk GPU 0 -> 1, odd nodes 1 -> 0,
#    so every inter-node hop joins GPUs of the same local rank. all_reduce with data checking again; the odd
#    node (rank 2) dumps the graph it used, and rank 0's "Channel xx/yy" lines give the ring order.
# One NIC (lo) per fake node means NCCL's own alternation (crossNic=2, docs/tuner.md) cannot trigger here; the
# graph file is the way to impose the layout on this machine.
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$(realpath -m "$3")
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
RANKS=4 RANKS_PER_HOST=2
source "$here/env.sh"
mkdir -p "$OUT"
summary="$OUT/ring-check-summary.txt"
: > "$summary"
args=(-b 8 -e 64M -f 4 -g 1 -c 1 -w 1 -n 3)
debug=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV)

check() {  # check NAME LOG: rows and #wrong of one run
  local wrong rows
  wrong=$(python3 "$here/nccl_tests_log.py" wrong "$2"); rows=$(python3 "$here/nccl_tests_log.py" rows "$2")
  echo "$1: exit $3, rows $rows, #wrong $wrong" | tee -a "$summary"
}

status=0
mpirun_ranks NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet "${debug[@]}" NCCL_DEBUG_FILE="$OUT/default.rank{rank}.nccl.txt" \
  NCCL_GRAPH_DUMP_FILE="$OUT/dump-even.xml" NCCL_GRAPH_DUMP_FILE_RANK=0 -- \
  "$TESTS/all_reduce_perf" "${args[@]}" > "$OUT/default.log" 2>&1 || status=$?
check "NCCL's ring" "$OUT/default.log" $status

python3 - "$OUT/dump-even.xml" "$OUT/ring-even.xml" "$OUT/ring-odd.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
tree = ET.parse(sys.argv[1])
root = tree.getroot()
for graph in list(root):
    if graph.get("id") != "0":  # keep the ring graph only; NCCL searches the others itself
        root.remove(graph)
tree.write(sys.argv[2])
for channel in root.iter("channel"):
    gpus = [c for c in channel if c.tag == "gpu"]
    nets = [c for c in channel if c.tag == "net"]
    for child in list(channel):
        channel.remove(child)
    ordered = nets[:1] + gpus[::-1] + nets[1:]
    channel.extend(ordered)
tree.write(sys.argv[3])
PY

status=0
mpirun_ranks NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet "${debug[@]}" NCCL_DEBUG_FILE="$OUT/alternating.rank{rank}.nccl.txt" \
  NCCL_GRAPH_DUMP_FILE="$OUT/dump-odd-used.xml" NCCL_GRAPH_DUMP_FILE_RANK=2 -- \
  bash -c 'node=$((OMPI_COMM_WORLD_RANK / 2))
           if [ $((node % 2)) -eq 0 ]; then export NCCL_GRAPH_FILE=$0/ring-even.xml; else export NCCL_GRAPH_FILE=$0/ring-odd.xml; fi
           exec "$@"' "$OUT" "$TESTS/all_reduce_perf" "${args[@]}" > "$OUT/alternating.log" 2>&1 || status=$?
check "alternating ring (NCCL_GRAPH_FILE per parity)" "$OUT/alternating.log" $status

# 3. Two emulated rails per fake node (RAILNET_TCP_ADDRESSES: two TCP devices on lo): NCCL's own search with
#    NCCL_CROSS_NIC at its default 2 may pick crossNic=2, and then swaps channel pairs on odd nodes itself
#    (src/graph/connect.cc L392-404). The ring graph's crossnic attribute and the Channel lines tell.
status=0
mpirun_ranks NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1 "${debug[@]}" \
  NCCL_DEBUG_FILE="$OUT/two-rails.rank{rank}.nccl.txt" NCCL_GRAPH_DUMP_FILE="$OUT/dump-two-rails.xml" \
  NCCL_GRAPH_DUMP_FILE_RANK=2 -- "$TESTS/all_reduce_perf" "${args[@]}" > "$OUT/two-rails.log" 2>&1 || status=$?
check "two emulated rails, NCCL's own search" "$OUT/two-rails.log" $status

{
  echo "NCCL's ring order (rank 0):";  grep -h -o 'Channel [0-9]*/[0-9]* :.*' "$OUT"/default.rank0.nccl.txt | head -4 || true
  echo "alternating ring order (rank 0):"; grep -h -o 'Channel [0-9]*/[0-9]* :.*' "$OUT"/alternating.rank0.nccl.txt | head -4 || true
  echo "graph files loaded:"; grep -h -o 'Search 0 : [0-9]* channels loaded from XML graph' "$OUT"/alternating.rank*.nccl.txt | sort | uniq -c || true
  echo "ring graph the odd node used (dump-odd-used.xml, graph id 0):"
  python3 - "$OUT/dump-odd-used.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    for graph in ET.parse(sys.argv[1]).getroot():
        if graph.get("id") == "0":
            for i, channel in enumerate(graph.iter("channel")):
                print(f"  channel {i}: " + " ".join(f"{c.tag}/{c.get('dev')}" for c in channel))
except Exception as error:  # noqa: BLE001
    print(f"  no dump: {error}")
PY
  echo "two emulated rails: ring graph of the odd node (dump-two-rails.xml) and rank 0's ring order:"
  python3 - "$OUT/dump-two-rails.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    for graph in ET.parse(sys.argv[1]).getroot():
        if graph.get("id") == "0":
            print(f"  crossnic={graph.get('crossnic')} nchannels={graph.get('nchannels')}")
            for i, channel in enumerate(graph.iter("channel")):
                print(f"  channel {i}: " + " ".join(f"{c.tag}/{c.get('dev')}" for c in channel))
except Exception as error:  # noqa: BLE001
    print(f"  no dump: {error}")
PY
  grep -h -o 'Channel [0-9]*/[0-9]* :.*' "$OUT"/two-rails.rank0.nccl.txt | head -4 || true
} | tee -a "$summary"
