#!/usr/bin/env bash
# The verbs transport against perftest on the same soft-RoCE device, in one guest run: bandwidth
# (railnet-bench vs ib_write_bw) and latency (railnet-bench ping-pong vs ib_write_lat), as ratios.
# Absolute numbers under qemu TCG emulation mean little; the ratios are what this measures.
#   tests/rxe/bench.sh [BUILD_DIR]        (default: build)
set -uo pipefail
if [ "${RAILNET_RXE_IN_GUEST:-0}" != 1 ]; then
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  build=$(realpath "${1:-build}")
  exec "$here/run-in-guest.sh" --timeout 1200 -- "$here/bench.sh" "$build"
fi

build=$1
dev=$RAILNET_RXE_DEV ip=$RAILNET_RXE_IP gid=$RAILNET_RXE_GID_INDEX
sizes=(4096 65536 1048576)
out=$(mktemp -d)

# perftest TOOL PORT ARGS...: server and client on the same device; prints the client's result line.
perftest() {
  local tool=$1 port=$2; shift 2
  local common=(-d "$dev" -i 1 -x "$gid" -p "$port" -F "$@")
  timeout 300 "$tool" "${common[@]}" > "$out/server" 2>&1 &
  local server=$!
  for _ in $(seq 1 200); do ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break; sleep 0.1; done
  timeout 300 "$tool" "${common[@]}" "$ip" > "$out/client" 2>&1
  wait "$server"
  awk '/^ *#bytes/ { h = 1; next } h && NF >= 3 && $1 ~ /^[0-9]+$/ { print; exit }' "$out/client"
}

echo "== ib_write_bw / ib_write_lat on $dev (GID $gid), same device both ends"
port=18600
for size in "${sizes[@]}"; do
  iterations=$(( size >= 1048576 ? 200 : 2000 ))
  echo "bw $size $(perftest ib_write_bw $((port++)) -s "$size" -n "$iterations" --report_gbits)" >> "$out/perftest"
done
for size in 256 4096; do
  echo "lat $size $(perftest ib_write_lat $((port++)) -s "$size" -n 2000)" >> "$out/perftest"
done
cat "$out/perftest"

echo "== railnet-bench, RAILNET_TRANSPORT=verbs"
RAILNET_TRANSPORT=verbs RAILNET_IB_HCA=$dev "$build/plugin/tools/railnet-bench" \
  --plugin "$build/libnccl-net-railnet.so" --min-size 8 --max-size 1m --step 16 --seconds 1 \
  2> "$out/bench.err" | tee "$out/bench"

python3 - "$out/perftest" "$out/bench" <<'PY'
import re, sys
perf = {}
for line in open(sys.argv[1]):
    kind, size, *fields = line.split()
    # bw line: bytes iters peak avg msgrate (Gb/s); lat line: bytes iters t_min t_max t_typical ...
    if kind == "bw" and len(fields) >= 4:
        perf[("bw", int(size))] = float(fields[3]) / 8  # GB/s
    elif kind == "lat" and len(fields) >= 5:
        perf[("lat", int(size))] = float(fields[4])     # t_typical, µs
units = {"B": 1, "KiB": 1024, "MiB": 1 << 20}
rail = {}
for line in open(sys.argv[2]):
    m = re.match(r"\s*(\d+) (B|KiB|MiB) \|\s*([\d.e+-]+) \|[^|]*\|[^|]*\|\s*([\d.]+) \|", line)
    if m:
        rail[int(m.group(1)) * units[m.group(2)]] = (float(m.group(3)), float(m.group(4)))
print("\n| size | railnet verbs GB/s | ib_write_bw GB/s | bw ratio (goal >= 0.9) |")
print("|---|---|---|---|")
for size in (4096, 65536, 1 << 20):
    if ("bw", size) in perf and size in rail:
        r, p = rail[size][0], perf[("bw", size)]
        print(f"| {size} | {r:.4f} | {p:.4f} | {r / p:.2f} |")
print("\n| size | railnet verbs lat us | ib_write_lat t_typical us | lat ratio (goal <= 1.2) |")
print("|---|---|---|---|")
for size in (256, 4096):
    if ("lat", size) in perf and size in rail:
        r, p = rail[size][1], perf[("lat", size)]
        print(f"| {size} | {r:.1f} | {p:.1f} | {r / p:.2f} |")
PY
rm -rf "$out"
