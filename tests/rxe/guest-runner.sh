#!/bin/bash
# Runs INSIDE the qemu guest, chrooted into the host's (read-only) root, as root. Started by the
# initramfs /init; run-in-guest.sh copies it into the per-run share directory as runner.sh.
# It sets up veth0/veth1 + rxe0 (and rxe1 on veth1 for --rxe-count 2), then runs the command from the share's argv file in its cwd
# with the caller's environment (share's env file) plus RAILNET_RXE_*, and records the status.
# Its stdout/stderr are the virtio-serial ports that run-in-guest.sh copies to the host's.
set -u
share=$(cd "$(dirname "$0")" && pwd)
. "$share/setup.conf"   # CWD, NETDEV_MTU, VERBOSE, LIMITS

fail() {
  {
    echo "run-in-guest: guest rxe setup FAILED: $*"
    echo "--- guest dmesg (tail) ---"
    dmesg | tail -n 40
  } > "$share/setup-error"
  exit 125
}
note() { [ "$VERBOSE" = 1 ] && echo "run-in-guest[guest]: $*" >&2; return 0; }

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RXE_COUNT=${RXE_COUNT:-1}
dev=rxe0 ip0=10.77.0.1 ip1=10.77.0.2
ip link set lo up || fail "ip link set lo up"
ip link add veth0 type veth peer name veth1 || fail "ip link add veth0 type veth peer name veth1"
ip link set veth0 mtu "$NETDEV_MTU" || fail "mtu $NETDEV_MTU on veth0"
ip link set veth1 mtu "$NETDEV_MTU" || fail "mtu $NETDEV_MTU on veth1"
ip addr add "$ip0/24" dev veth0 || fail "address on veth0"
ip addr add "$ip1/24" dev veth1 || fail "address on veth1"
ip link set veth0 up || fail "veth0 up"
ip link set veth1 up || fail "veth1 up"
rdma link add rxe0 type rxe netdev veth0 || fail "rdma link add rxe0 type rxe netdev veth0"
if [ "$RXE_COUNT" = 2 ]; then
  # rxe1 on the pair's other end. Both addresses are local, so by default a packet between them leaves through
  # lo, which has no rxe device, and rxe drops it. Policy routing sends traffic from one address to the other
  # out of its own veth instead (the local table moves behind two rules); the receiving end must accept a
  # local source address. Each device still reaches itself through rxe's own loopback.
  rdma link add rxe1 type rxe netdev veth1 || fail "rdma link add rxe1 type rxe netdev veth1"
  for c in all default veth0 veth1; do
    sysctl -qw "net.ipv4.conf.$c.accept_local=1" "net.ipv4.conf.$c.rp_filter=0" || fail "sysctl on $c"
  done
  ip rule add pref 100 lookup local || fail "ip rule add pref 100 lookup local"
  ip rule del pref 0 lookup local || fail "ip rule del pref 0 lookup local"
  ip route add "$ip1" dev veth0 src "$ip0" table 101 || fail "route table 101"
  ip route add "$ip0" dev veth1 src "$ip1" table 102 || fail "route table 102"
  ip rule add pref 10 iif lo from "$ip0" to "$ip1" lookup 101 || fail "ip rule 101"
  ip rule add pref 11 iif lo from "$ip1" to "$ip0" lookup 102 || fail "ip rule 102"
fi

# Waits until rxe<k>'s port is ACTIVE, the uverbs node exists, and the RoCE v2 GID of its address is there;
# sets gid_index.
wait_port() {
  local dev=$1 ip=$2
  local port=/sys/class/infiniband/$dev/ports/1
  local want_gid=0000:0000:0000:0000:0000:ffff:$(printf '%02x%02x:%02x%02x' ${ip//./ })
  gid_index=
  for _ in $(seq 1 300); do
    if grep -q ACTIVE "$port/state" 2>/dev/null && ls /dev/infiniband/uverbs* > /dev/null 2>&1; then
      for g in "$port"/gids/*; do   # 1024 entries: builtins only (a fork costs ~50 ms under TCG)
        i=${g##*/} v='' t=''
        read -r v < "$g" 2>/dev/null
        [ "$v" = "$want_gid" ] || continue
        read -r t < "$port/gid_attrs/types/$i" 2>/dev/null
        if [ "$t" = "RoCE v2" ]; then gid_index=$i; break; fi
      done
      [ -n "$gid_index" ] && return 0
    fi
    sleep 0.1
  done
  fail "$dev: port not ACTIVE or no RoCE v2 GID for $ip after 30 s (state: $(cat "$port/state" 2>/dev/null))"
}
devs=rxe0 ips=$ip0
if [ "$RXE_COUNT" = 2 ]; then
  wait_port rxe1 "$ip1"
  devs=rxe0,rxe1 ips=$ip0,$ip1
fi
wait_port rxe0 "$ip0"   # last, so gid_index is rxe0's
ib_mtu=$(ibv_devinfo -d "$dev" 2>/dev/null | sed -n 's/^[[:space:]]*active_mtu:[[:space:]]*\([0-9]*\).*/\1/p' | head -1)
note "up $(cut -d' ' -f1 /proc/uptime)s after boot: $devs ($ips); $dev on veth0 $ip0 (peer veth1 $ip1), GID index $gid_index, active MTU ${ib_mtu:-?}"

# Twice: a hard limit below the guest's current soft one only sticks once the soft one is lower.
eval "$LIMITS" 2>/dev/null; eval "$LIMITS" 2>/dev/null || note "could not apply all of: $LIMITS"

cd "$CWD" 2>/dev/null || fail "cannot cd to $CWD in the guest (is it hidden by the guest's /tmp tmpfs? pass --rw)"

# The caller's environment, verbatim (NUL-separated), then the rig's own variables.
envs=()
while IFS= read -r -d '' kv; do
  case "$kv" in RAILNET_RXE_*|PWD=*|OLDPWD=*) continue ;; esac
  envs+=("$kv")
done < "$share/env"
envs+=(
  "PWD=$CWD"
  RAILNET_RXE_IN_GUEST=1
  "RAILNET_RXE_DEV=$dev"
  RAILNET_RXE_PORT=1
  RAILNET_RXE_NETDEV=veth0
  "RAILNET_RXE_IP=$ip0"
  RAILNET_RXE_PEER_NETDEV=veth1
  "RAILNET_RXE_PEER_IP=$ip1"
  "RAILNET_RXE_GID_INDEX=$gid_index"
  "RAILNET_RXE_IB_MTU=${ib_mtu:-}"
  "RAILNET_RXE_NETDEV_MTU=$NETDEV_MTU"
  "RAILNET_RXE_DEVS=$devs"
  "RAILNET_RXE_IPS=$ips"
)
argv=()
while IFS= read -r -d '' a; do argv+=("$a"); done < "$share/argv"

# env -i takes leading NAME=VALUE words as assignments: a command word with '=' goes through sh.
case "${argv[0]}" in
  *=*) env -i "${envs[@]}" /bin/sh -c 'exec "$@"' sh "${argv[@]}" ;;
  *)   env -i "${envs[@]}" "${argv[@]}" ;;
esac
st=$?
echo "$st" > "$share/status"
sync
exit "$st"
