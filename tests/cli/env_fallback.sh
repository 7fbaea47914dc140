#!/usr/bin/env bash
# railnet-info --env: with only NCCL_SOCKET_IFNAME set, RAILNET_IFNAME takes its value and names it as the source;
# with both set, railnet's own wins.
#   tests/cli/env_fallback.sh RAILNET_INFO
set -u
info=$1
line=$(env -u RAILNET_IFNAME NCCL_SOCKET_IFNAME==lo "$info" --env | grep '^RAILNET_IFNAME ')
echo "$line"
grep -q '=lo .*(from NCCL_SOCKET_IFNAME)' <<<"$line" || { echo "FAIL: NCCL_SOCKET_IFNAME not taken"; exit 1; }
line=$(RAILNET_IFNAME=eth NCCL_SOCKET_IFNAME==lo "$info" --env | grep '^RAILNET_IFNAME ')
echo "$line"
grep -q 'eth .*(from RAILNET_IFNAME)' <<<"$line" || { echo "FAIL: RAILNET_IFNAME did not win"; exit 1; }
line=$(env -u RAILNET_IB_QPS_PER_CONNECTION NCCL_IB_QPS_PER_CONNECTION=16 "$info" --env 2>&1 | grep -E '^RAILNET_IB_QPS_PER_CONNECTION |QPS_PER_CONNECTION="16"')
echo "$line"
grep -q '^RAILNET_IB_QPS_PER_CONNECTION *8 .*(from NCCL_IB_QPS_PER_CONNECTION)' <<<"$line" || { echo "FAIL: not clamped to 8"; exit 1; }
grep -q 'outside railnet' <<<"$line" || { echo "FAIL: no warning for the clamped value"; exit 1; }
echo "PASS"
