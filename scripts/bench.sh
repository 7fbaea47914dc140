#!/usr/bin/env bash
# Build railnet and run railnet-bench, its loopback benchmark against raw TCP.
#   scripts/bench.sh [--build-dir DIR] [railnet-bench options...]
# e.g. scripts/bench.sh --quick --csv bench.csv     (CI: fewer points, 64 MiB max)
# The table goes to stdout; the exit status is railnet-bench's (1 only for errors, not for a missed goal).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="$root/build"
if [[ ${1:-} == --build-dir ]]; then
  build_dir=$(realpath -m "$2")
  shift 2
fi

if [[ ! -f $build_dir/build.ninja ]]; then
  meson setup "$build_dir" "$root" >&2
fi
ninja -C "$build_dir" libnccl-net-railnet.so plugin/tools/railnet-bench >&2

exec "$build_dir/plugin/tools/railnet-bench" --plugin "$build_dir/libnccl-net-railnet.so" "$@"
