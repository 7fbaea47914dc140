#!/usr/bin/env bash
# Bandwidth over time across a NIC's failure and failback on a fused TCP device of two loopback rails, each shaped
# to a NIC's rate (fabric emulation), NIC 1's data streams cut after CUT_BYTES (RAILNET_FAULT_NIC_CUT): railnet-bench
# --timeline, then a plot of it when matplotlib is there (docs/failover.md). Any Linux machine with a built tree.
# MODE single: the device is lo@127.0.1.1 alone (lo@127.0.2.1 its host's other NIC), its NIC is cut, and the connection
# moves to the other NIC and back (docs/failover.md "Single-NIC devices").
#   scripts/perf/failover-timeline.sh BENCH PLUGIN OUT_DIR [SECONDS] [NIC_MBPS] [CUT_BYTES] [fused|single]
set -euo pipefail
bench=$1
plugin=$2
out=$3
seconds=${4:-8}
mbps=${5:-16000}
cut=${6:-4000000000}
mode=${7:-fused}
mkdir -p "$out"
export RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1 RAILNET_SHAPE_NIC_MBPS=$mbps
case "$mode" in
  fused) device=lo@127.0.1.1+lo@127.0.2.1; cut_nic=1 ;;
  single) device=lo@127.0.1.1; cut_nic=0 ;;
  *) echo "mode must be fused or single" >&2; exit 2 ;;
esac
RAILNET_FAULT_NIC_CUT=$cut_nic RAILNET_FAULT_NIC_CUT_BYTES=$cut \
  "$bench" --plugin "$plugin" --device "$device" --against lo@127.0.1.1 --max-size 4m \
  --timeline "$seconds" --csv "$out/timeline.csv" > "$out/timeline.txt" 2> "$out/timeline.err"
grep -h "failed;\|moved to\|answers again" "$out/timeline.err" || true
if python3 -c "import matplotlib" 2> /dev/null; then
  python3 "$(dirname "$0")/timeline_plot.py" "$out/timeline.csv" "$out/timeline.err" "$out/failover-timeline.png" "$mbps" \
    "$mode"
fi
