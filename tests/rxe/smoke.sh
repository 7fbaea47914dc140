#!/usr/bin/env bash
# Smoke test of the soft-RoCE rig: boots the guest (tests/rxe/run-in-guest.sh --rxe-count 2) and, inside it,
# runs ibv_devices, ibv_devinfo -d rxe0, then ib_write_bw and ib_write_lat with server and client
# both on rxe0 (client -> 10.77.0.1), then ib_write_bw from rxe0 to rxe1 (client on rxe0 -> 10.77.0.2,
# the rig's routing between devices). Prints the numbers. Exits 0 only if verbs traffic flowed:
# both perftest sides exited 0, the client printed a non-zero result, and the devices' packet
# counters moved.
#   tests/rxe/smoke.sh [--timeout SEC]      (from the host; default timeout 300 s)
# Ends with "rxe smoke: N passed, N failed".
set -uo pipefail

if [ "${RAILNET_RXE_IN_GUEST:-0}" != 1 ]; then
  timeout_s=300
  case "${1:-}" in
    --timeout) timeout_s=$2 ;;
    "") ;;
    *) echo "usage: $0 [--timeout SEC]" >&2; exit 2 ;;
  esac
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  exec "$here/run-in-guest.sh" --rxe-count 2 --ro-cwd --cwd / --timeout "$timeout_s" -- "$here/smoke.sh"
fi

# ---- inside the guest ----
dev=$RAILNET_RXE_DEV ip=$RAILNET_RXE_IP gid=$RAILNET_RXE_GID_INDEX
passed=0 failed=0
check() {  # check NAME COND...
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "PASS: $name"; else failed=$((failed + 1)); echo "FAIL: $name"; fi
}
pkts() {  # pkts DEV: packets sent + received (builtins: a fork costs ~50 ms under TCG)
  local c=/sys/class/infiniband/$1/ports/1/hw_counters s r
  read -r s < "$c/sent_pkts"; read -r r < "$c/rcvd_pkts"; echo $((s + r))
}
gid_of() {  # gid_of DEV IP: index of the RoCE v2 GID of IP on DEV's port 1 (empty if none)
  local p=/sys/class/infiniband/$1/ports/1 want g v t
  want=0000:0000:0000:0000:0000:ffff:$(printf '%02x%02x:%02x%02x' ${2//./ })
  for g in "$p"/gids/*; do
    read -r v < "$g" 2>/dev/null; [ "$v" = "$want" ] || continue
    read -r t < "$p/gid_attrs/types/${g##*/}" 2>/dev/null; [ "$t" = "RoCE v2" ] && { echo "${g##*/}"; return; }
  done
}
wait_listen() {  # wait_listen PORT: until a TCP listener is on PORT (perftest's handshake)
  for _ in $(seq 1 200); do
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
    sleep 0.1
  done
  return 1
}

echo "== guest: $(uname -r), $(nproc) CPUs; $dev on $RAILNET_RXE_NETDEV $ip, GID index $gid, active MTU $RAILNET_RXE_IB_MTU"
echo "== ibv_devices"
ibv_devices; rc=$?
check "ibv_devices lists $dev" test "$rc" = 0 -a -n "$(ibv_devices | awk -v d="$dev" '$1 == d')"
echo "== ibv_devinfo -d $dev"
ibv_devinfo -d "$dev"; rc=$?
check "ibv_devinfo: port ACTIVE" test "$rc" = 0 -a -n "$(ibv_devinfo -d "$dev" | grep 'PORT_ACTIVE')"
echo "== GIDs of $dev port 1"
# (rxe has a 1024-entry GID table; builtins only: every fork+exec costs ~50 ms under TCG)
p1=/sys/class/infiniband/$dev/ports/1
for g in "$p1"/gids/*; do
  i=${g##*/}; read -r v < "$g" || continue
  [ "$v" = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue
  t=; n=; read -r t < "$p1/gid_attrs/types/$i" 2>/dev/null; read -r n < "$p1/gid_attrs/ndevs/$i" 2>/dev/null
  echo "  index $i: $v $t $n"
done

# perftest <tool> <port> <args...>: server in the background, client in the foreground. Both on $dev unless
# srv_dev/srv_gid (the server's device and GID, which the client connects to at srv_ip) and cli_dev/cli_gid are set.
perftest() {
  local tool=$1 port=$2; shift 2
  local sdev=${srv_dev:-$dev} sgid=${srv_gid:-$gid} sip=${srv_ip:-$ip} cdev=${cli_dev:-$dev} cgid=${cli_gid:-$gid}
  local common=(-i 1 -p "$port" -F "$@")
  local srv_log cli_log before after srv_rc cli_rc devs=$sdev
  [ "$cdev" = "$sdev" ] || devs="$cdev $sdev"
  srv_log=$(mktemp) cli_log=$(mktemp)
  declare -A before=()
  for d in $devs; do before[$d]=$(pkts "$d"); done
  echo "== $tool -d $sdev -x $sgid ${common[*]} (server) / -d $cdev -x $cgid ... $sip (client)"
  timeout 120 "$tool" -d "$sdev" -x "$sgid" "${common[@]}" > "$srv_log" 2>&1 &
  local srv=$!
  if ! wait_listen "$port"; then
    echo "server did not listen on $port:"; cat "$srv_log"
  fi
  timeout 120 "$tool" -d "$cdev" -x "$cgid" "${common[@]}" "$sip" > "$cli_log" 2>&1; cli_rc=$?
  wait "$srv"; srv_rc=$?
  echo "-- client (exit $cli_rc):"; cat "$cli_log"
  [ "$srv_rc" = 0 ] || { echo "-- server (exit $srv_rc):"; cat "$srv_log"; }
  check "$tool: server and client exit 0" test "$srv_rc" = 0 -a "$cli_rc" = 0
  # The result line follows the header line that starts with " #bytes".
  result=$(awk '/^ *#bytes/ { h = 1; next } h && NF >= 3 && $1 ~ /^[0-9]+$/ { print; exit }' "$cli_log")
  check "$tool: client reported a result" test -n "$result"
  check "$tool: non-zero result" awk -v l="$result" 'BEGIN { n = split(l, f); exit !(n >= 3 && f[3] + 0 > 0) }'
  for d in $devs; do
    after=$(pkts "$d")
    echo "-- $d packets sent+received during the run: $((after - before[$d]))"
    check "$tool: $d counters moved" test $((after - before[$d])) -gt 100
  done
  RESULT=$result
  rm -f "$srv_log" "$cli_log"
}

perftest ib_write_bw 18515 -s 65536 -n 1000 --report_gbits
bw=$RESULT
perftest ib_write_lat 18516 -s 8 -n 1000
lat=$RESULT
xbw=
if [[ ",${RAILNET_RXE_DEVS:-}," == *,rxe1,* ]]; then
  # Between two devices: the rig's bridge and policy routing (run-in-guest.sh --rxe-count 2).
  ip1=${RAILNET_RXE_IPS#*,} ip1=${ip1%%,*}
  srv_dev=rxe1 srv_ip=$ip1 srv_gid=$(gid_of rxe1 "$ip1") cli_dev=$dev cli_gid=$gid
  perftest ib_write_bw 18517 -s 65536 -n 1000 --report_gbits
  xbw=$RESULT
  unset srv_dev srv_ip srv_gid cli_dev cli_gid
fi

echo "== summary (qemu TCG guest, soft-RoCE $dev, server and client on the same device; then $dev -> rxe1)"
echo "ib_write_bw  #bytes #iters BW_peak[Gb/s] BW_avg[Gb/s] MsgRate[Mpps]: $bw"
echo "ib_write_lat #bytes #iters t_min[us] t_max[us] t_typical[us] t_avg[us] t_stdev[us] 99%[us] 99.9%[us]: $lat"
[ -n "$xbw" ] && echo "ib_write_bw  $dev -> rxe1 #bytes #iters BW_peak[Gb/s] BW_avg[Gb/s] MsgRate[Mpps]: $xbw"
echo "rxe smoke: $passed passed, $failed failed"
[ "$failed" = 0 ]
