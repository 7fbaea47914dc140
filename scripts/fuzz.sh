#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang, ASan+UBSan) in ./build-fuzz and runs each one.
#   scripts/fuzz.sh [SECONDS]           each target for SECONDS (default 10), from its committed corpus
#   scripts/fuzz.sh --runs N            each target for N executions (the long campaign: 10000000)
#   scripts/fuzz.sh --build-only        builds them and stops
# New inputs go to build-fuzz/corpus/<target>/ (tests/fuzz/corpus/ is only read); a crash leaves its input in
# build-fuzz/crashes/ and fails the run. Ends with one summary line "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
limit=(-max_total_time="${1:-10}")
if [ "${1:-}" = --runs ]; then limit=(-runs="${2:?--runs needs a count}"); fi
if [ ! -f build-fuzz/build.ninja ]; then
  CXX=clang++ meson setup build-fuzz -Dfuzz=true -Dbuildtype=debugoptimized >&2
fi
ninja -C build-fuzz >&2
[ "${1:-}" = --build-only ] && exit 0
mkdir -p build-fuzz/crashes
passed=0
failed=0
for target in $(ls tests/fuzz/corpus); do
  work=build-fuzz/corpus/$target
  mkdir -p "$work"
  log=build-fuzz/$target.log
  status=0
  # One process per target; -print_final_stats gives the executions. Leaks count as failures (ASan).
  "build-fuzz/tests/fuzz/$target" "${limit[@]}" -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/"$target"- \
    "$work" "tests/fuzz/corpus/$target" > "$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if [ "$status" -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS $target: ${runs:-?} executions (${rate:-?}/s), corpus $(ls "$work" | wc -l) inputs"
  else
    failed=$((failed + 1))
    echo "FAIL $target (exit $status): $(grep -m1 -E 'ERROR|runtime error|deadly signal' "$log" || echo 'see log')"
    echo "  log: $log; input: $(ls build-fuzz/crashes/"$target"-* 2>/dev/null | head -1)"
  fi
done
echo "fuzz: ${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
