#!/usr/bin/env bash
# The long form of verbs path failover in the soft-RoCE guest (docs/failover.md "Verbs"): one connection over a device
# fused from rxe0 and rxe1 through FAILURES link failures (ip link set down on the netdev under one port, then up):
# NIC 1's and NIC 0's first, then either at random moments for 0.2-3 s each, under checksummed transfers; every
# message must arrive and each path come back. CI runs the first two (fusion.verbs_path_failover in
# scripts/test.sh --rxe). SEED repeats a run (default: a fresh one, printed). MODE single: a single-NIC device's
# connection (rxe0 to rxe0) instead, through FAILURES failures of rxe0's link, each a move to its standby path on rxe1
# and back (fusion.verbs_single_nic_move, D96).
#   tests/rxe/failover-campaign.sh [FAILURES] [SEED] [BUILD_DIR] [fused|single]   (defaults: 30, random, build, fused)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
failures=${1:-30}
seed=${2:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
build=${3:-build}
case "${4:-fused}" in
  fused) filter=verbs_path_failover ;;
  single) filter=verbs_single_nic_move ;;
  *) echo "MODE must be fused or single" >&2; exit 2 ;;
esac
echo "verbs failover campaign (${4:-fused}): $failures failures, seed $seed"
RAILNET_TRANSPORT=verbs RAILNET_RAILS=rxe0:0,rxe1:1 RAILNET_TEST_RXE_NETDEVS=veth0,veth1 \
  RAILNET_TEST_PATH_FAILURES=$failures RAILNET_TEST_PATH_SEED=$seed \
  "$here/run-in-guest.sh" --rxe-count 2 --timeout $((120 + 15 * failures)) -- \
  "$build/tests/conformance/railnet-conformance" --plugin "$build/libnccl-net-railnet.so" --version 12 \
  --group fusion --filter "$filter" --test-timeout $((60 + 15 * failures))
