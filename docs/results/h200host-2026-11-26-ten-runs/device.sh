#!/usr/bin/env bash
# On the GPU host (16 cores) used as eight 2-core machines: each slot is a pair of cores (taskset) running one CI
# stage's tests several times in a row while a parallel build loads the same two cores.
#   .carry/ten/device.sh "SLOT:BUILD:RUNS[:SUFFIX] ..."   e.g. "0:build:3 1:build-asan:3" (tests-BUILD-SUFFIX.json)
set -u
# The CI machine has no GPU: hide libcuda (a mount namespace binds /dev/null over it), or the CUDA driver's own
# thread and descriptors, which outlive dlclose, would fail the tests that count them.
if [ -z "${IN_NS:-}" ]; then exec unshare -m env IN_NS=1 "$0" "$@"; fi
for lib in $(ldconfig -p | awk '/libcuda\.so/ {print $NF}'); do mount --bind /dev/null "$(readlink -f "$lib")"; done
root=$PWD
mkdir -p /work && ln -sfn "$root" /work/main
cd /work/main
tar xJf .carry/ten/bins.tar.xz
export LD_LIBRARY_PATH=/work/main/lib:/work/main/.carry/lib:${LD_LIBRARY_PATH:-}
export RAILNET_TCP_THREADS=2   # what min(2 x streams, cores, 16) gives on a 2-core machine
mkdir -p "$OUT"
pids=()
for spec in $1; do
  IFS=: read -r slot build runs suffix <<< "$spec"
  cores="$((2 * slot)),$((2 * slot + 1))"
  ( case $build in
      build-asan) export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ;;
      build-tsan) export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ;;
    esac
    taskset -c "$cores" .carry/ten/load.sh & load=$!
    taskset -c "$cores" python3 .carry/ten/run_stage.py ".carry/ten/tests-$build${suffix:+-$suffix}.json" "/work/main/$build" "$runs" \
      "$OUT/slot$slot-$build" > "$OUT/slot$slot.txt" 2>&1
    kill -- -$load 2>/dev/null; pkill -P $load 2>/dev/null; kill $load 2>/dev/null
  ) &
  pids+=($!)
done
( sleep "${LIMIT_S:-560}"; echo "TIME LIMIT: stopping" >> "$OUT/limit.txt"; pkill -f run_stage.py ) & limiter=$!
for pid in "${pids[@]}"; do wait "$pid"; done
kill $limiter 2>/dev/null
pkill -f load.sh; pkill -f "g++ -std=c++20" ; true
cat "$OUT"/slot*.txt; cat "$OUT"/limit.txt 2>/dev/null; uptime
