#!/usr/bin/env bash
# Configures (once) and builds a railnet build directory.
#   scripts/build.sh [BUILD_DIR] [extra meson setup options...]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
if [ ! -f "$build_dir/build.ninja" ]; then
  meson setup "$build_dir" "$@" >&2
fi
ninja -C "$build_dir" >&2
