#!/usr/bin/env bash
# Installs what railnet needs to build and test on Debian 12 / Ubuntu 22.04+ (clang and its libFuzzer runtime
# for scripts/fuzz.sh; iptables for the host-loss trials).
set -euo pipefail
packages=(g++ meson ninja-build pkg-config libhwloc-dev libibverbs-dev catch2 iproute2 iptables python3 clang libclang-rt-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "bootstrap: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
