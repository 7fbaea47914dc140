#!/usr/bin/env bash
# Verbs path failover over time, in one soft-RoCE guest run (docs/failover.md "Verbs", performance.md): railnet-bench
# --timeline on the device fused from rxe0 and rxe1 while the link under rxe1 (veth1) goes down DOWN_AT s into it and
# comes back UP_AT s into it; first, the same timeline on rxe0 alone, the surviving NIC's own rate. Prints the issue's
# ratios (degraded / surviving NIC alone, the time until the full rate is back) and writes the timelines (CSV) and,
# where matplotlib is, a plot. Under qemu TCG the guest's CPU limits soft-RoCE, not its links: one rxe device moves
# about as much as two, so the ratios say what failover costs beyond the path it lost, not what a second NIC adds.
# The timeline's first slice comes about 5 s after its start under TCG (the first messages set the connection up), so
# the link goes down 9 s in by default.
# MODE single (D96): the single-NIC device rxe0 instead, while veth0 goes down and comes back: the connection moves to
# its standby path on rxe1 and back; the reference is rxe1 alone, the NIC that carries it meanwhile.
#   tests/rxe/failover-timeline.sh OUT_DIR [BUILD_DIR] [SECONDS] [DOWN_AT] [UP_AT] [fused|single]
#   (defaults: build 20 9 14 fused)
set -uo pipefail
if [ "${RAILNET_RXE_IN_GUEST:-0}" != 1 ]; then
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  out=$(realpath -m "$1")
  build=$(realpath "${2:-build}")
  mkdir -p "$out"
  RAILNET_TRANSPORT=verbs RAILNET_RAILS=rxe0:0,rxe1:1 "$here/run-in-guest.sh" --rxe-count 2 --timeout 900 --rw "$out" -- \
    "$here/failover-timeline.sh" "$out" "$build" "${3:-20}" "${4:-9}" "${5:-14}" "${6:-fused}" || exit $?
  if python3 -c "import matplotlib" 2> /dev/null; then
    python3 "$here/failover_timeline_plot.py" "$out" || true
  fi
  exit 0
fi

out=$1 build=$2 seconds=$3 down_at=$4 up_at=$5 mode=${6:-fused}
case "$mode" in
  fused) alone_dev=rxe0 main_dev=rxe0+rxe1 link=veth1 ;;
  single) alone_dev=rxe1 main_dev=rxe0 link=veth0 ;;
  *) echo "MODE must be fused or single" >&2; exit 2 ;;
esac
bench=("$build/plugin/tools/railnet-bench" --plugin "$build/libnccl-net-railnet.so" --max-size 1m)
# Each output line stamped with the wall clock, so the timeline's start ("timeline: ...") places the link events.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }

echo "== $alone_dev alone"
stdbuf -oL "${bench[@]}" --device "$alone_dev" --timeline 4 --csv "$out/alone.csv" 2> "$out/alone.err" | stamp > "$out/alone.txt"
echo "== $main_dev, $link down at ${down_at} s, up at ${up_at} s"
stdbuf -oL "${bench[@]}" --device "$main_dev" --timeline "$seconds" --csv "$out/fused.csv" --verbose 2> "$out/fused.err" |
  stamp > "$out/fused.txt" &
bench_pid=$!
for _ in $(seq 1 300); do grep -q "timeline:" "$out/fused.txt" 2> /dev/null && break; sleep 0.1; done
start=$(awk '/timeline:/ { print $1; exit }' "$out/fused.txt")
since_start() { awk -v now="$(date +%s.%N)" -v start="$start" 'BEGIN { printf "%.3f", now - start }'; }
# One sleep for the time left (under TCG every process started costs tens of ms, so no polling loop).
sleep_until() { sleep "$(awk -v at="$1" -v now="$(since_start)" 'BEGIN { d = at - now; printf "%.3f", (d > 0 ? d : 0) }')"; }
sleep_until "$down_at"
ip link set "$link" down
printf 'mode %s\ndown %s\n' "$mode" "$(since_start)" > "$out/events"
sleep_until "$up_at"
ip link set "$link" up
echo "up $(since_start)" >> "$out/events"
wait "$bench_pid"
status=$?
grep -h "WARN.*failed (\|WARN.*answers again\|WARN.*standby path" "$out/fused.err" | sed 's/.*NET\/railnet: //' | cut -c1-200
python3 - "$out" "$mode" <<'PY'
import csv, sys
out, mode = sys.argv[1], sys.argv[2]
rows = lambda name: [(float(r["t_s"]), float(r["gbps"])) for r in csv.DictReader(open(f"{out}/{name}.csv"))]
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
alone = mean([g for t, g in rows("alone") if t >= 0.5])
events = dict(line.split() for line in open(f"{out}/events"))
down, up = float(events["down"]), float(events["up"])
fused = rows("fused")
full = mean([g for t, g in fused if 0.5 <= t <= down])
degraded = mean([g for t, g in fused if down + 0.5 <= t <= up])
# The first moment after the link's return from which the next second averages at least 0.95 x full.
back = next((t for t, _ in fused if t >= up and mean([g for s, g in fused if t <= s <= t + 1]) >= 0.95 * full
             and [s for s, _ in fused if s >= t + 1]), None)
if mode == "single":
    print(f"| rxe1 alone | rxe0, its link up | rxe0's link down (on the standby path, rxe1) | degraded / alone (goal "
          f">= 0.9) | full rate again after the link's return (goal <= 5 s) |")
else:
    print(f"| rxe0 alone | fused, both links | fused, rxe1's link down | degraded / alone (goal >= 0.9) | full rate "
          f"again after the link's return (goal <= 5 s) |")
print("|---|---|---|---|---|")
print(f"| {alone:.4f} GB/s | {full:.4f} GB/s | {degraded:.4f} GB/s | {degraded / alone:.2f} | "
      + (f"{back - up:.1f} s |" if back is not None else "not within the run |"))
PY
exit "$status"
