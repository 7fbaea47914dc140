#!/usr/bin/env bash
# Builds railnet's relocatable release tarball: what `meson install` ships (the stripped plugin, the tuner link, the
# tools, the doorbell API's headers), laid out as lib/, bin/ and include/railnet/, plus env.sh, which points NCCL at it. Unpack it anywhere, e.g. /opt/railnet in a
# training image (docs/container.md), and source env.sh or set the two variables it sets.
#   scripts/package.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, the current directory)
# Prints the tarball's path: OUT_DIR/railnet-<version>-<arch>.tar.gz, whose top directory is railnet-<version>/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
out=$(realpath "${2:-.}")
[ -f "$build/build.ninja" ] || { echo "package.sh: no build in $build (scripts/build.sh first)" >&2; exit 2; }
version=$(meson introspect "$build" --projectinfo | python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
name=railnet-$version
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
meson install -C "$build" --destdir "$stage/dest" --quiet >&2
so=$(find "$stage/dest" -name libnccl-net-railnet.so -type f | head -1)
[ -n "$so" ] || { echo "package.sh: meson install produced no libnccl-net-railnet.so" >&2; exit 1; }
mkdir -p "$stage/$name/lib" "$stage/$name/bin"
cp -a "$(dirname "$so")"/libnccl-net-railnet.so "$(dirname "$so")"/libnccl-tuner-railnet.so "$stage/$name/lib/"
for tool in railnet-info railnet-tune railnet-bench; do
  cp -a "$(find "$stage/dest" -name "$tool" -type f | head -1)" "$stage/$name/bin/"
done
headers=$(find "$stage/dest" -path '*/include/railnet' -type d | head -1)
[ -n "$headers" ] || { echo "package.sh: meson install produced no include/railnet" >&2; exit 1; }
mkdir -p "$stage/$name/include"
cp -a "$headers" "$stage/$name/include/"
cp "$root/LICENSE" "$root/CHANGELOG.md" "$stage/$name/"
cat > "$stage/$name/env.sh" <<'ENV'
# Sourced in a job's environment: NCCL loads railnet's net plugin and tuner from this directory.
railnet_home=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export NCCL_NET_PLUGIN="$railnet_home/lib/libnccl-net-railnet.so"
export NCCL_TUNER_PLUGIN="$railnet_home/lib/libnccl-tuner-railnet.so"
export PATH="$railnet_home/bin:$PATH"
ENV
mkdir -p "$out"
tarball="$out/$name-$(uname -m).tar.gz"
tar -C "$stage" -czf "$tarball" --owner=0 --group=0 "$name"
echo "$tarball"
