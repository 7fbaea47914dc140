#!/usr/bin/env bash
# railnet-bench under several TCP settings, one line of settings per run, for the "both directions at once"
# investigation (docs/performance.md). Host memory only; runs on any Linux machine with a built tree.
#   scripts/perf/bidir-sweep.sh BUILD_DIR OUT_DIR "BENCH OPTIONS" ["VAR=VALUE ..." ...]
# The first run uses no settings; each further argument is one run with those environment settings.
# Example: scripts/perf/bidir-sweep.sh build out/bidir "--bidir --min-size 256k --max-size 64m" \
#            "RAILNET_TCP_THREADS=16" "RAILNET_TCP_MIN_CHUNK_BYTES=262144"
set -uo pipefail
build=$1
out=$2
read -r -a bench_options <<< "$3"
shift 3
mkdir -p "$out"
bench="$build/plugin/tools/railnet-bench"
plugin="${PLUGIN:-$build/libnccl-net-railnet.so}"
echo "machine: $(nproc) cores, $(uname -r); plugin $plugin; options ${bench_options[*]}" | tee "$out/summary.txt"
index=0
for settings in "" "$@"; do
  index=$((index + 1))
  echo "=== run $index: ${settings:-defaults}" | tee -a "$out/summary.txt"
  # shellcheck disable=SC2086  # settings is a list of VAR=VALUE words
  env $settings "$bench" --plugin "$plugin" "${bench_options[@]}" --csv "$out/run$index.csv" \
    > "$out/run$index.txt" 2> "$out/run$index.err"
  grep -E "^ +[0-9]+ [KM]iB|summary" "$out/run$index.txt" | tee -a "$out/summary.txt"
done
