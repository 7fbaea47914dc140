#!/usr/bin/env bash
# The rail failure campaign, long form (issue 20; docs/failover.md; tests/conformance/README.md, "The campaign
# group"). Rails that really fail: tests/conformance/veth-rails.sh makes two network namespaces joined by one veth pair
# per rail, and the conformance group "campaign" sends checksummed messages (0-4 MiB, 8 in flight) from namespace A to
# a receiver process in namespace B while it injects FAILURES failures per case (default 100), one at a time, each at a
# random point (before a connect, mid-transfer, just before a close) and of a random kind (link down, a silent
# iptables drop, TCP resets, sockets killed with ss -K), undone after 0.2-3 s. Every message must arrive intact and
# no request fail. Cases, each in namespaces of its own: fused2 and fused4 (a device fused from 2 or 4 rails) and
# single (device 0 alone, the other rails its spares).
#   scripts/failover-campaign.sh [options] [FAILURES]
#     --cases LIST   a comma-separated subset of fused2,fused4,single (default: all three)
#     --rails N      rails to make (default 4; fused4 needs 4, single 2)
#     --build DIR    build directory (default build); it is built first (scripts/build.sh) unless --no-build
#     --no-build     use DIR as it is
#     --log FILE     where the harness's whole output goes (default: a file under ${TMPDIR:-/tmp}, named at the end)
#     --help, --version
# Environment: RAILNET_CAMPAIGN_RATE=RATE shapes every rail to RATE each way (tc tbf, e.g. 2gbit);
# RAILNET_CAMPAIGN_SEED=N repeats a run (each run prints its seed); RAILNET_CAMPAIGN_POINTS and RAILNET_CAMPAIGN_KINDS
# (comma-separated: connect,mid-transfer,close; link-down,drop,reset,kill) draw from some only;
# RAILNET_CAMPAIGN_AWAIT_FAILBACK=1 holds each failure until every NIC the sender took out has failed back;
# RAILNET_CAMPAIGN_DEADLINE_S (30) bounds each message. Other RAILNET_* settings reach the plugin in both processes.
# Needs root. Prints each case's PASS or FAIL line and its NOTE summary (seed, failures by kind and point, messages,
# bytes, the plugin's failover WARNs on each side), then one line per case; exits 1 if any case failed.
set -euo pipefail
cd "$(dirname "$0")/.."
me=$(basename "$0")
usage() {
  echo "usage: $me [--cases fused2,fused4,single] [--rails N] [--build DIR] [--no-build] [--log FILE] [FAILURES]"
}
cases=fused2,fused4,single
rails=4
build_dir=build
build=1
log=""
failures=100
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --version)
      version=$(sed -n "s/^ *version : '\([^']*\)'.*/\1/p" meson.build | head -1)
      revision=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
      echo "$me $version (revision $revision)"
      exit 0
      ;;
    --cases) cases=${2:?--cases needs a list}; shift 2 ;;
    --rails) rails=${2:?--rails needs a number}; shift 2 ;;
    --build) build_dir=${2:?--build needs a directory}; shift 2 ;;
    --no-build) build=0; shift ;;
    --log) log=${2:?--log needs a file}; shift 2 ;;
    -*) echo "$me: unknown option $1" >&2; usage >&2; exit 2 ;;
    *)
      [[ "$1" =~ ^[0-9]+$ ]] || { echo "$me: FAILURES must be a number, got $1" >&2; exit 2; }
      failures=$1
      shift
      ;;
  esac
done
for c in ${cases//,/ }; do
  case "$c" in fused2|fused4|single) ;; *) echo "$me: unknown case $c (fused2, fused4, single)" >&2; exit 2 ;; esac
done
[ "$(id -u)" -eq 0 ] || { echo "$me: needs root (network namespaces, veth pairs, iptables)" >&2; exit 1; }
[ "$build" -eq 1 ] && scripts/build.sh "$build_dir"
harness=$build_dir/tests/conformance/railnet-conformance
plugin=$PWD/$build_dir/libnccl-net-railnet.so
if [ ! -x "$harness" ] || [ ! -f "$plugin" ]; then
  echo "$me: no harness or plugin in $build_dir (build it)" >&2
  exit 1
fi
[ -n "$log" ] || log=$(mktemp "${TMPDIR:-/tmp}/failover-campaign.XXXXXX.log")
: > "$log"

# The harness's alarm per case: each failure costs its dwell (up to 3 s), the messages around it and, when awaited,
# its failback (probes at 1, 3, 7, 15 s ... after it).
per_failure=15
[ "${RAILNET_CAMPAIGN_AWAIT_FAILBACK:-0}" = 1 ] && per_failure=40
test_timeout=$((failures * per_failure + 300))
echo "$me: $failures failures per case over $rails rails${RAILNET_CAMPAIGN_RATE:+ shaped to $RAILNET_CAMPAIGN_RATE}," \
  "cases $cases; log $log"
status=0
results=()
for c in ${cases//,/ }; do
  start=$(date +%s)
  case_status=0
  RAILNET_CAMPAIGN_FAILURES=$failures tests/conformance/veth-rails.sh "$rails" "$harness" --plugin "$plugin" \
    --group campaign --version 12 --filter "$c" --test-timeout "$test_timeout" >> "$log" 2>&1 || case_status=$?
  seconds=$(($(date +%s) - start))
  line=$(grep -E "^(PASS|FAIL|SKIP) v12/campaign\.$c" "$log" | tail -1 || true)
  grep -E "^NOTE v12/campaign\.$c" "$log" | tail -1 || true
  echo "${line:-"no result for $c: exit status $case_status (see $log)"}"
  if [ "$case_status" -ne 0 ] && [ "$case_status" -ne 77 ]; then status=1; fi
  results+=("$c: $( [ "$case_status" -eq 0 ] && echo pass || echo "FAIL (exit $case_status)") in $seconds s")
done
echo "$me summary ($failures failures per case; log $log):"
printf '  %s\n' "${results[@]}"
exit "$status"
