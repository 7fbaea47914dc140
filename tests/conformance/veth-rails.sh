#!/usr/bin/env bash
# Rails that can really fail (issue 20, docs/failover.md "Order of work", step 3): two network namespaces, A and B,
# joined by N veth pairs, one per rail. Rail i (1..N) is rnA<i> 10.77.<i>.1/24 in A and rnB<i> 10.77.<i>.2/24 in B;
# every link and lo are up. COMMAND runs inside A with
#   RAILNET_TCP_ADDRESSES        A's addresses (10.77.1.1,...,10.77.N.1): one railnet TCP device per rail
#   RAILNET_CAMPAIGN_NETNS_A/_B  the two namespaces' names (ip netns), for `ip -n NAME` and setns(2)
#   RAILNET_CAMPAIGN_RAILS       N
#   RAILNET_TEST_NETNS=1         it runs in a network namespace of its own, where iptables rules touch no host
# and the namespaces go away when it ends, fails, or this script is interrupted (INT, TERM, HUP); namespaces left by
# a run that was SIGKILLed are removed by the next run (their names carry the dead run's process id).
#   tests/conformance/veth-rails.sh N COMMAND [ARGS...]      (--help, --version)
# RAILNET_CAMPAIGN_RATE=RATE (tc's units, e.g. 1gbit or 500mbit) shapes every rail to RATE each way: a tbf qdisc on
# both ends of each veth pair. Needs root, ip (iproute2), iptables and veth. Exits 77 (meson's SKIP) when the
# namespaces cannot be made, unless RAILNET_TEST_REQUIRE_NETNS=1 (CI), which makes that a failure. Otherwise exits
# with COMMAND's status.
set -euo pipefail
me=veth-rails.sh
usage() { echo "usage: $me N COMMAND [ARGS...]   (N rails, 1..32)"; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --version)
    root=$(dirname "$0")/../..
    version=$(sed -n "s/^ *version : '\([^']*\)'.*/\1/p" "$root/meson.build" | head -1)
    echo "$me $version (revision $(git -C "$root" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown))"
    exit 0
    ;;
  "") usage >&2; exit 2 ;;
esac
rails=$1
shift
if ! [[ "$rails" =~ ^[0-9]+$ ]] || [ "$rails" -lt 1 ] || [ "$rails" -gt 32 ] || [ $# -eq 0 ]; then
  usage >&2
  exit 2
fi

skip_or_fail() {
  if [ "${RAILNET_TEST_REQUIRE_NETNS:-0}" = 1 ]; then
    echo "$me: $1, and RAILNET_TEST_REQUIRE_NETNS=1" >&2
    exit 1
  fi
  echo "SKIP: $1" >&2
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip_or_fail "named network namespaces and veth pairs need root"
command -v ip >/dev/null || skip_or_fail "ip (iproute2) is not installed"
command -v iptables >/dev/null || skip_or_fail "iptables is not installed (apt-get install iptables)"

prefix=railnet-rails
ns_a=$prefix-A-$$
ns_b=$prefix-B-$$

# Namespaces of runs that were killed outright (SIGKILL leaves no trap to run): their process is gone.
for stale in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep "^$prefix-[AB]-[0-9]*$" || true); do
  pid=${stale##*-}
  kill -0 "$pid" 2>/dev/null || ip netns delete "$stale" 2>/dev/null || true
done

child=""
# shellcheck disable=SC2317  # run by the traps
cleanup() {
  trap - EXIT INT TERM HUP
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; fi
  # Deleting a namespace deletes its end of every veth pair, and with it the other end.
  ip netns delete "$ns_a" 2>/dev/null || true
  ip netns delete "$ns_b" 2>/dev/null || true
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 129' HUP

ip netns add "$ns_a" 2>/dev/null || skip_or_fail "ip netns add failed (no network namespaces here)"
ip netns add "$ns_b" 2>/dev/null || skip_or_fail "ip netns add failed (no network namespaces here)"
addresses=""
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
  # A spare NIC may send from its own address to the peer's address on another rail, and the answer come back over
  # that rail: no reverse-path filter.
  ip netns exec "$ns" sh -c 'echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter &&
    echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter'
done
for i in $(seq 1 "$rails"); do
  ip -n "$ns_a" link add "rnA$i" type veth peer name "rnB$i" netns "$ns_b" 2>/dev/null ||
    skip_or_fail "cannot make a veth pair (no veth support in this kernel?)"
  ip -n "$ns_a" addr add "10.77.$i.1/24" dev "rnA$i"
  ip -n "$ns_b" addr add "10.77.$i.2/24" dev "rnB$i"
  ip -n "$ns_a" link set "rnA$i" up
  ip -n "$ns_b" link set "rnB$i" up
  if [ -n "${RAILNET_CAMPAIGN_RATE:-}" ]; then
    # A token bucket per end: the rail carries RATE each way. The bucket holds 512 KiB, a few GSO segments.
    ip netns exec "$ns_a" tc qdisc add dev "rnA$i" root tbf rate "$RAILNET_CAMPAIGN_RATE" burst 512kb latency 100ms
    ip netns exec "$ns_b" tc qdisc add dev "rnB$i" root tbf rate "$RAILNET_CAMPAIGN_RATE" burst 512kb latency 100ms
  fi
  addresses+=${addresses:+,}10.77.$i.1
done
# The links are up at once on each end; wait until both ends report carrier (the peer's end comes up last).
for i in $(seq 1 "$rails"); do
  for _ in $(seq 1 50); do
    if ip -n "$ns_a" link show "rnA$i" | grep -q LOWER_UP && ip -n "$ns_b" link show "rnB$i" | grep -q LOWER_UP; then
      break
    fi
    sleep 0.1
  done
done

# In the background, so that a signal reaches this script's traps at once and not after COMMAND ends.
ip netns exec "$ns_a" env RAILNET_TCP_ADDRESSES="$addresses" RAILNET_CAMPAIGN_NETNS_A="$ns_a" \
  RAILNET_CAMPAIGN_NETNS_B="$ns_b" RAILNET_CAMPAIGN_RAILS="$rails" RAILNET_TEST_NETNS=1 "$@" &
child=$!
status=0
wait "$child" || status=$?
child=""
exit "$status"
