#!/usr/bin/env bash
# What `meson install` ships (issue 16): the plugin stripped (no debug sections) and, for a plain build, under
# 4 MiB; the tuner name a link to it; the tools beside it. Installs into a temporary DESTDIR, never the system.
#   tests/cli/install_check.sh BUILD_DIR SANITIZER     (meson passes its build root and b_sanitize)
set -u
build=$1 sanitize=${2:-none}
dest=$(mktemp -d); trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet > "$dest.log" 2>&1 || { cat "$dest.log"; rm -f "$dest.log"; exit 1; }
rm -f "$dest.log"
so=$(find "$dest" -name libnccl-net-railnet.so -type f | head -1)
tuner=$(find "$dest" -name libnccl-tuner-railnet.so | head -1)
failures=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }
check "the plugin is installed" "[ -n \"\$so\" ]"
check "libnccl-tuner-railnet.so is a link to it" "[ -L \"\$tuner\" ] && [ \"\$(readlink \"\$tuner\")\" = libnccl-net-railnet.so ]"
check "the installed plugin has no debug sections" "! readelf -S \"\$so\" | grep -q '\\.debug_'"
size=$(stat -c %s "$so" 2>/dev/null || echo 0)
echo "installed plugin: $size bytes"
if [ "$sanitize" = none ]; then
  check "the installed plugin is under 4 MiB" "[ $size -lt $((4 * 1024 * 1024)) ]"
fi
for tool in railnet-info railnet-tune railnet-bench; do
  check "$tool is installed" "[ -n \"\$(find \"\$dest\" -name $tool -type f)\" ]"
done
echo "$failures failed"
[ "$failures" -eq 0 ]
