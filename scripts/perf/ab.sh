#!/usr/bin/env bash
# A/B of railnet builds or settings with railnet-bench: the arms take turns, round after round, so that a machine
# whose load drifts shifts every arm alike; the summary gives each arm's median per size and its ratio to the first
# arm. Host memory; any Linux machine with built trees.
#   scripts/perf/ab.sh BENCH OUT_DIR ROUNDS "BENCH OPTIONS" "LABEL|PLUGIN|VAR=VALUE ..." "LABEL|PLUGIN|..." ...
# Example (a change against the build before it, and a setting):
#   scripts/perf/ab.sh build/plugin/tools/railnet-bench out/ab 3 "--min-size 64k --max-size 64m" \
#     "before|/tmp/old/build/libnccl-net-railnet.so|" "after|build/libnccl-net-railnet.so|" \
#     "delivered|build/libnccl-net-railnet.so|RAILNET_SEND_COMPLETION=delivered"
set -uo pipefail
bench=$1
out=$2
rounds=$3
read -r -a bench_options <<< "$4"
shift 4
mkdir -p "$out"
echo "machine: $(nproc) cores, $(uname -r); load $(cut -d' ' -f1-3 /proc/loadavg); options ${bench_options[*]}" \
  | tee "$out/summary.txt"
for round in $(seq 1 "$rounds"); do
  for arm in "$@"; do
    IFS='|' read -r label plugin settings <<< "$arm"
    # shellcheck disable=SC2086  # settings is a list of VAR=VALUE words
    env $settings "$bench" --plugin "$plugin" "${bench_options[@]}" --csv "$out/$label.$round.csv" \
      > "$out/$label.$round.txt" 2> "$out/$label.$round.err" || echo "round $round, $label: exit $?" | tee -a "$out/summary.txt"
  done
done
labels=()
for arm in "$@"; do labels+=("${arm%%|*}"); done
python3 - "$out" "$rounds" "${labels[@]}" <<'PY' | tee -a "$out/summary.txt"
import csv, statistics, sys
out, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}  # (label, direction, size) -> [(gbps, lat)]
for label in labels:
    for r in range(1, rounds + 1):
        try:
            for row in csv.DictReader(open(f"{out}/{label}.{r}.csv")):
                key = (label, row["direction"], int(row["size_bytes"]))
                rows.setdefault(key, []).append((float(row["railnet_gbps"]), float(row["railnet_lat_us"])))
        except FileNotFoundError:
            pass
keys = sorted({(d, s) for (_, d, s) in rows})
print(f"medians of {rounds} rounds: GB/s and latency (us); ratios to '{labels[0]}'")
print("direction  size      " + "".join(f"| {l:>22} " for l in labels))
for d, s in keys:
    base = rows.get((labels[0], d, s))
    line = f"{d:<9} {s:>9} "
    for l in labels:
        v = rows.get((l, d, s))
        if not v:
            line += f"| {'-':>22} "
            continue
        g = statistics.median(x[0] for x in v); t = statistics.median(x[1] for x in v)
        bg = statistics.median(x[0] for x in base) if base else 0
        line += f"| {g:7.2f} {t:8.1f} ({g / bg if bg else 0:4.2f}) "
    print(line)
PY
