#!/usr/bin/env bash
# Configures (once; later calls apply the options they pass) and builds a railnet build directory.
#   scripts/build.sh [BUILD_DIR] [extra meson setup options...]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
# The options a directory was last given, so that a second call with the same ones does not regenerate it.
stamp=$build_dir/railnet-build-options
if [ ! -f "$build_dir/build.ninja" ]; then
  meson setup "$build_dir" "$@" >&2
elif [ $# -gt 0 ] && [ "$*" != "$(cat "$stamp" 2>/dev/null)" ]; then
  # An existing build directory takes the options it is given now (a script's options may have changed).
  meson configure "$build_dir" "$@" >&2
fi
echo "$*" > "$stamp"
ninja -C "$build_dir" >&2
