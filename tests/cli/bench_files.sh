#!/usr/bin/env bash
# railnet-bench writes its rows for plots (issue 16): --csv is a header and one line per row, --json is JSON Lines
# (a "run" object, then one object per row keyed like the CSV columns), from one short loopback run.
#   tests/cli/bench_files.sh RAILNET_BENCH
set -u
bench=$1
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
failures=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }
RAILNET_IFNAME=lo "$bench" --one-way --min-size 8 --max-size 4K --step 512 --seconds 0.05 \
  --csv "$dir/rows.csv" --json "$dir/rows.jsonl" > "$dir/out.txt" 2>&1
status=$?
check "railnet-bench exits 0" "[ $status -eq 0 ]"
[ "$status" -eq 0 ] || tail -5 "$dir/out.txt"
check "the CSV has a header and 2 rows (8 B, 4 KiB)" "[ \$(wc -l < \"$dir/rows.csv\") -eq 3 ]"
check "every CSV line has 10 fields" "awk -F, 'NF != 10 { bad = 1 } END { exit bad }' \"$dir/rows.csv\""
check "the CSV header starts direction,size_bytes" "head -1 \"$dir/rows.csv\" | grep -q '^direction,size_bytes,'"
if command -v python3 > /dev/null; then
  check "the JSON Lines parse: a run object, then rows keyed like the CSV" "python3 - \"$dir\" <<'PY'
import csv, json, sys
d = sys.argv[1]
lines = [json.loads(l) for l in open(d + '/rows.jsonl')]
header = next(csv.reader(open(d + '/rows.csv')))
assert 'run' in lines[0] and lines[0]['run']['device'], lines[0]
rows = lines[1:]
assert len(rows) == 2 and [r['size_bytes'] for r in rows] == [8, 4096], rows
assert all(list(r.keys()) == header for r in rows), (list(rows[0].keys()), header)
assert all(isinstance(r['railnet_gbps'], float) and r['railnet_gbps'] > 0 for r in rows), rows
PY"
else
  echo "SKIP the JSON check: no python3"
fi
echo "$failures failed"
[ "$failures" -eq 0 ]
