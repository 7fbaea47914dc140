#!/usr/bin/env bash
# The release tarball (scripts/package.sh, docs/container.md) works where it is unpacked (issue 16): the stripped
# plugin with its GIN, net and tuner tables, the tuner link, env.sh pointing NCCL at them, and the tools running from
# the tarball's bin/ with railnet-bench moving bytes through the packaged plugin. Nothing is installed on the system.
#   tests/cli/package_check.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 build=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
failures=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }
tarball=$("$src/scripts/package.sh" "$build" "$dir/out" 2> "$dir/package.log" | tail -1)
check "scripts/package.sh makes a tarball" "[ -f \"\$tarball\" ]"
[ -f "$tarball" ] || { cat "$dir/package.log"; exit 1; }
mkdir -p "$dir/opt" && tar -C "$dir/opt" -xzf "$tarball"
home=$(find "$dir/opt" -maxdepth 1 -name 'railnet-*' -type d | head -1)
so=$home/lib/libnccl-net-railnet.so
check "it holds the plugin" "[ -f \"\$so\" ]"
check "and the tuner name as a link to it" "[ \"\$(readlink \"\$home/lib/libnccl-tuner-railnet.so\")\" = libnccl-net-railnet.so ]"
for symbol in ncclNetPlugin_v12 ncclNetPlugin_v8 ncclGinPlugin_v11 ncclRmaPlugin_v14 ncclTunerPlugin_v6; do
  check "the plugin exports $symbol" "nm -D --defined-only \"\$so\" | grep -qw $symbol"
done
check "the plugin exports the doorbell API" "nm -D --defined-only \"\$so\" | grep -qw railnet_doorbell_init"
for header in doorbell.h doorbell_device.cuh doorbell_layout.h host_device.h doorbell_direct.h \
  doorbell_direct_producer.h doorbell_direct_device.cuh mlx5_wqe.h; do
  check "it holds include/railnet/$header" "[ -f \"\$home/include/railnet/$header\" ]"
done
check "doorbell.h compiles as C from the tarball" \
  "echo '#include <railnet/doorbell.h>' | cc -std=c99 -Wall -Werror -fsyntax-only -I \"\$home/include\" -x c -"
check "doorbell_layout.h compiles as C++17 from the tarball" \
  "echo '#include <railnet/doorbell_layout.h>' | c++ -std=c++17 -Wall -Werror -fsyntax-only -I \"\$home/include\" -x c++ -"
env_out=$(bash -c "source \"$home/env.sh\" && echo \"\$NCCL_NET_PLUGIN|\$NCCL_TUNER_PLUGIN|\$(command -v railnet-info)\"")
check "env.sh points NCCL_NET_PLUGIN at the packaged plugin" "[ \"\${env_out%%|*}\" = \"\$so\" ]"
check "env.sh puts the tools on PATH" "[ \"\${env_out##*|}\" = \"\$home/bin/railnet-info\" ]"
check "railnet-info --version runs from the tarball" "\"\$home/bin/railnet-info\" --version | grep -q '^railnet-info '"
RAILNET_IFNAME=lo "$home/bin/railnet-bench" --one-way --min-size 4K --max-size 4K --seconds 0.05 > "$dir/bench.txt" 2>&1
status=$?
check "railnet-bench from the tarball finds the packaged plugin and moves data" \
  "[ $status -eq 0 ] && grep -Eq \"plugin \$home/(bin/\\.\\./)?lib/libnccl-net-railnet.so \" \"\$dir/bench.txt\""
[ "$status" -eq 0 ] || tail -5 "$dir/bench.txt"
echo "$failures failed"
[ "$failures" -eq 0 ]
