#!/usr/bin/env bash
# Runs one nccl-tests collective under several environment variants in the same session and prints one
# table (time in us and busbw in GB/s per variant), for tuning. A variant is "name=ENV=VALUE,ENV=VALUE";
# the transport words railnet / socket / socket4x4 expand to their environments (env.sh).
#   scripts/gpu/variants.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR COLLECTIVE "NCCL_TESTS_ARGS" VARIANT...
# e.g. variants.sh lib.so tests out all_reduce "-b 8 -e 32K -f 4 -n 200" "rn=railnet" "sock=socket"
set -euo pipefail
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$3; COLL=$4; ARGS=$5; shift 5
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
source "$here/env.sh"
mkdir -p "$OUT"
names=()
for variant in "$@"; do
  name=${variant%%=*}
  envs=()
  IFS=',' read -r -a words <<< "${variant#*=}"
  for word in "${words[@]}"; do
    case "$word" in
      railnet|railnet-gpu|railnet-notuner|socket|socket4x4|socket4x4ch8) read -r -a expanded <<< "$(transport_env "$word")"; envs+=("${expanded[@]}") ;;
      *) envs+=("$word") ;;
    esac
  done
  # shellcheck disable=SC2086  # ARGS is a list of nccl-tests options
  # NCCL's log goes to its own file so it cannot split nccl-tests' rows on stdout.
  mpirun_ranks "${envs[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$OUT/$COLL-$name.nccl.%p" -- \
    "$TESTS/${COLL}_perf" $ARGS -g 1 -c 0 > "$OUT/$COLL-$name.log" 2>&1 ||
    echo "variant $name failed (see $OUT/$COLL-$name.log)" >&2
  python3 "$here/nccl_tests_log.py" table "$OUT/$COLL-$name.log" > "$OUT/$COLL-$name.csv"
  names+=("$name")
done
python3 - "$OUT" "$COLL" "${names[@]}" <<'PY'
import csv, sys
out, coll, names = sys.argv[1], sys.argv[2], sys.argv[3:]
tables = {n: {int(r["size"]): r for r in csv.DictReader(open(f"{out}/{coll}-{n}.csv"))} for n in names}
sizes = sorted(set().union(*[t.keys() for t in tables.values()]))
print(f"{coll}: time us / busbw GB/s")
print("| size | " + " | ".join(names) + " |")
print("|---" * (len(names) + 1) + "|")
for s in sizes:
    cells = []
    for n in names:
        r = tables[n].get(s)
        cells.append(f"{float(r['time_us']):.1f} / {float(r['busbw']):.2f}" if r else "-")
    print(f"| {s} | " + " | ".join(cells) + " |")
PY
for name in "${names[@]}"; do
  channels=$(cat "$OUT/$COLL-$name".nccl.* | grep -m1 -oE '[0-9]+ coll channels' || true)
  cpu=$(cat "$OUT/$COLL-$name".nccl.* | grep -oE 'moved [0-9.]+ GB using [0-9.]+ s of CPU' | head -1 || true)
  echo "$name: $channels; $cpu"
done
