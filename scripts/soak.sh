#!/usr/bin/env bash
# The soak (docs/reliability.md "Soak"): the conformance group "soak" for SECONDS (default 3600) in the normal,
# ASan+UBSan or TSan build. Randomized traffic over many comms and threads, reload cycles and registration races,
# every byte checked; descriptors, threads and memory must come back after every cycle. Prints the harness's NOTE
# lines (seed, cycles, bytes) and ends with "N passed, N failed".
#   scripts/soak.sh [--asan|--tsan] [SECONDS]
# RAILNET_SOAK_SEED=N repeats a run; other RAILNET_* settings pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/variants.sh
variant=""
case "${1:-}" in --asan|--tsan) variant=$1; shift ;; esac
build_variant "$variant"
seconds=${1:-3600}
scripts/build.sh "$build_dir" "${options[@]}"
max_size=()
[ "$variant" = --tsan ] && max_size=(--max-size 16M)
[ "$variant" = --asan ] && max_size=(--max-size 64M)
RAILNET_IFNAME=${RAILNET_IFNAME:-lo} RAILNET_SOAK_S=$seconds \
  "$build_dir/tests/conformance/railnet-conformance" --plugin "$build_dir/libnccl-net-railnet.so" \
  --group soak --version 12 --test-timeout $((seconds + 900)) "${max_size[@]}"
