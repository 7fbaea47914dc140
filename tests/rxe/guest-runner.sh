#!/bin/bash
# Runs INSIDE the qemu guest, chrooted into the host's (read-only) root, as root. Started by the
# initramfs /init; run-in-guest.sh copies it into the per-run share directory as runner.sh.
# It sets up veth0/veth1 + rxe0 (or rxe0..rxe3 on a bridge for --rxe-count 2..4: see below), then runs the command from the share's
# argv file in its cwd with the caller's environment (share's env file) plus RAILNET_RXE_*, and records the status.
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
# Device k (0..3) is rxe<k> on veth<k>, address 10.77.0.<k+1>/24. One device: veth0 <-> veth1, rxe0 on veth0 only.
dev=rxe0 ip0=10.77.0.1 ip1=10.77.0.2
rxe_ips=()
for ((k = 0; k < RXE_COUNT; k++)); do rxe_ips[k]=10.77.0.$((k + 1)); done
ip link set lo up || fail "ip link set lo up"
if [ "$RXE_COUNT" = 1 ]; then
  ip link add veth0 type veth peer name veth1 || fail "ip link add veth0 type veth peer name veth1"
  ip link set veth0 mtu "$NETDEV_MTU" || fail "mtu $NETDEV_MTU on veth0"
  ip link set veth1 mtu "$NETDEV_MTU" || fail "mtu $NETDEV_MTU on veth1"
  ip addr add "$ip0/24" dev veth0 || fail "address on veth0"
  ip addr add "$ip1/24" dev veth1 || fail "address on veth1"
  ip link set veth0 up || fail "veth0 up"
  ip link set veth1 up || fail "veth1 up"
  rdma link add rxe0 type rxe netdev veth0 || fail "rdma link add rxe0 type rxe netdev veth0"
else
  # Several devices that all reach each other (tests/rxe/README.md, "Several rxe devices"). Every veth<k> is one end
  # of a veth pair whose other end, vbr<k>, is a port of the bridge br0, so all of them share one L2 segment. All
  # addresses are local, so by default a packet between two of them goes through lo, which has no rxe device, and
  # rxe drops it. Instead the local table's rule moves from priority 0 to 100, and for each ordered pair (a, b) a
  # rule sends traffic from a's address to b's out of veth<a> (table 101+a), to b's MAC through a permanent
  # neighbour entry; the receiving end accepts a packet with a local source address (accept_local=1, rp_filter=0),
  # and arp_ignore=1 keeps the bridge and the other veths from answering ARP for addresses that are not theirs.
  # Each device still reaches itself through rxe's own loopback. The sysctls go first: new devices copy "default".
  for c in all default; do
    sysctl -qw "net.ipv4.conf.$c.accept_local=1" "net.ipv4.conf.$c.rp_filter=0" "net.ipv4.conf.$c.arp_ignore=1" ||
      fail "sysctl on $c"
  done
  ip link add br0 type bridge || fail "ip link add br0 type bridge"
  ip link set br0 up || fail "br0 up"
  for ((k = 0; k < RXE_COUNT; k++)); do
    ip link add "veth$k" mtu "$NETDEV_MTU" type veth peer name "vbr$k" mtu "$NETDEV_MTU" ||
      fail "ip link add veth$k type veth peer name vbr$k"
    ip link set "vbr$k" master br0 up || fail "vbr$k into br0"
    ip addr add "${rxe_ips[k]}/24" dev "veth$k" || fail "address on veth$k"
    ip link set "veth$k" up || fail "veth$k up"
    rdma link add "rxe$k" type rxe netdev "veth$k" || fail "rdma link add rxe$k type rxe netdev veth$k"
  done
  ip rule add pref 100 lookup local || fail "ip rule add pref 100 lookup local"
  ip rule del pref 0 lookup local || fail "ip rule del pref 0 lookup local"
  macs=()
  for ((k = 0; k < RXE_COUNT; k++)); do read -r "macs[k]" < "/sys/class/net/veth$k/address"; done
  for ((a = 0; a < RXE_COUNT; a++)); do
    ip route add 10.77.0.0/24 dev "veth$a" src "${rxe_ips[a]}" table $((101 + a)) || fail "route table $((101 + a))"
    for ((b = 0; b < RXE_COUNT; b++)); do
      [ "$a" != "$b" ] || continue
      ip neigh replace "${rxe_ips[b]}" lladdr "${macs[b]}" dev "veth$a" nud permanent || fail "neighbour on veth$a"
      ip rule add pref $((10 + 4 * a + b)) iif lo from "${rxe_ips[a]}" to "${rxe_ips[b]}" lookup $((101 + a)) ||
        fail "ip rule from ${rxe_ips[a]} to ${rxe_ips[b]}"
    done
  done
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
for ((k = 1; k < RXE_COUNT; k++)); do
  wait_port "rxe$k" "${rxe_ips[k]}"
  devs=$devs,rxe$k ips=$ips,${rxe_ips[k]}
done
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
