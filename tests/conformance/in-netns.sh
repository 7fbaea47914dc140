#!/usr/bin/env bash
# Runs a command in a network namespace of its own with only loopback up, where a test may add iptables rules
# without touching the host's (the conformance group host_loss). Root gets a plain network namespace; another user
# a user namespace too, where the kernel allows it. Exits 77 (meson's SKIP) when no namespace can be made, unless
# RAILNET_TEST_REQUIRE_NETNS=1 (CI), which makes that a failure.
#   tests/conformance/in-netns.sh COMMAND [ARGS...]
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
unshare_args=(--net)
[ "$(id -u)" -eq 0 ] || unshare_args=(--user --map-root-user --net)
why=""
if ! command -v unshare >/dev/null; then
  why="unshare (util-linux) is not installed"
elif ! command -v iptables >/dev/null; then
  why="iptables is not installed (apt-get install iptables)"
elif ! unshare "${unshare_args[@]}" true 2>/dev/null; then
  why="this user cannot create a network namespace (run as root, or allow unprivileged user namespaces)"
fi
if [ -n "$why" ]; then
  if [ "${RAILNET_TEST_REQUIRE_NETNS:-0}" = 1 ]; then
    echo "in-netns.sh: $why, and RAILNET_TEST_REQUIRE_NETNS=1" >&2
    exit 1
  fi
  echo "SKIP: $why" >&2
  exit 77
fi
exec unshare "${unshare_args[@]}" -- sh -c 'ip link set lo up && RAILNET_TEST_NETNS=1 exec "$@"' in-netns "$@"
