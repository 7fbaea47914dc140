#!/usr/bin/env bash
# The soft-RoCE CI stage (scripts/test.sh --rxe) RUNS times in a row on this 2-core machine, under a parallel build's
# load (.carry/ten/load.sh: two g++ -O2 loops on both cores) and, while it runs, whatever LOAD_EXTRA names (a
# command started once in the background, e.g. the normal-build soak in place of one g++ loop).
#   .carry/ten/rxe-ten.sh OUTDIR [RUNS]
set -u
out=$1; runs=${2:-10}
mkdir -p "$out"
loops=2
if [ -n "${LOAD_EXTRA:-}" ]; then
  setsid bash -c "$LOAD_EXTRA" > "$out/load-extra.log" 2>&1 & extra=$!
  loops=1
fi
files=$(ls proxy/tcp/*.cc proxy/protocol/*.cc proxy/progress/*.cc proxy/staging/*.cc base/*.cc plugin/tuner/*.cc)
loop() { while :; do for f in $files; do g++ -std=c++20 -O2 -I include -I . -I build -c "$f" -o /dev/null 2>/dev/null; done; done; }
pids=()
for _ in $(seq $loops); do loop & pids+=($!); done
# Once LOAD_EXTRA ends, a second g++ loop takes its place.
if [ -n "${LOAD_EXTRA:-}" ]; then ( while kill -0 $extra 2>/dev/null; do sleep 5; done; loop ) & pids+=($!); fi
for i in $(seq "$runs"); do
  start=$(date +%s)
  scripts/test.sh --rxe > "$out/run$i.log" 2>&1; status=$?
  echo "run $i: exit $status, $(( $(date +%s) - start )) s, $(tail -1 "$out/run$i.log"), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/summary.txt"
done
for p in "${pids[@]}"; do pkill -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
pkill -f "g++ -std=c++20 -O2 -I include" ; true
