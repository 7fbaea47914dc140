#!/usr/bin/env bash
# Emulated rails with real bandwidth limits on one CPU machine: shapes loopback traffic per rail with tc/htb,
# so NIC fusion over RAILNET_TCP_ADDRESSES rails can be measured (docs/rails-tc.md). Needs root and tc.
#   scripts/rails-tc.sh up [--rails N] [--rate RATE] [--cross-rate RATE]
#       rail r (1..N, default 2) is 127.0.r.0/24: traffic with source and destination in it gets RATE
#       (default 1gbit); traffic between two rails (the "spine") shares --cross-rate (default RATE/4, an
#       oversubscribed path); all other loopback traffic stays unshaped.
#   scripts/rails-tc.sh down           removes what "up" installed (only the htb root with railnet's handle)
#   scripts/rails-tc.sh status         the classes with their byte counters
#   scripts/rails-tc.sh bench [ARGS]   railnet-bench (build/plugin/tools, or $RAILNET_BENCH) with the rails as
#       RAILNET_TCP_ADDRESSES: the first two rails fused (lo@127.0.1.1+lo@127.0.2.1) against the first alone
#       (lo@127.0.1.1), then any ARGS (a later --device/--against wins)
set -euo pipefail
cd "$(dirname "$0")/.."
me="rails-tc"
die() { echo "$me: $*" >&2; exit 1; }
handle=7261:   # "ra": marks the root qdisc as ours
dev=lo

installed() { tc qdisc show dev "$dev" | grep -q "htb $handle root"; }
rate_kbit() {   # "1gbit" -> kbit, for the default cross rate
  local value=$1 number unit
  number=${value%%[a-zA-Z]*}; unit=${value#"$number"}
  [[ "$number" =~ ^[0-9]+$ ]] || die "rate $value: use a whole number of gbit, mbit or kbit"
  case "$unit" in
    gbit) echo $((number * 1000000)) ;; mbit) echo $((number * 1000)) ;; kbit) echo "$number" ;;
    *) die "rate $value: use NNNgbit, NNNmbit or NNNkbit" ;;
  esac
}

up() {
  local rails=2 rate=1gbit cross=
  while [ $# -gt 0 ]; do
    case "$1" in
      --rails) rails=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --cross-rate) cross=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [[ "$rails" =~ ^[1-9]$ ]] || die "--rails wants 1..9"
  rate_kbit "$rate" > /dev/null   # dies here on a bad rate (inside $(...) below it could not)
  [ -n "$cross" ] || cross="$(( $(rate_kbit "$rate") / 4 ))kbit"
  rate_kbit "$cross" > /dev/null
  installed && die "already up (scripts/rails-tc.sh down first)"
  # Loopback segments reach 64 KiB (GSO): bursts and quanta must hold a few of them.
  local shape=(burst 512k cburst 512k quantum 65536)
  tc qdisc add dev "$dev" root handle "$handle" htb default 999
  trap 'echo "$me: up failed; removing the partial setup" >&2; tc qdisc del dev "$dev" root' ERR
  tc class add dev "$dev" parent "$handle" classid "${handle}1" htb rate 400gbit "${shape[@]}"
  tc class add dev "$dev" parent "${handle}1" classid "${handle}999" htb rate 400gbit "${shape[@]}"
  tc class add dev "$dev" parent "${handle}1" classid "${handle}99" htb rate "$cross" ceil "$cross" "${shape[@]}"
  local r s prio=1
  for r in $(seq 1 "$rails"); do
    tc class add dev "$dev" parent "${handle}1" classid "${handle}$((10 + r))" htb rate "$rate" ceil "$rate" "${shape[@]}"
    for s in $(seq 1 "$rails"); do
      local class=$((10 + r))
      [ "$r" = "$s" ] || class=99
      tc filter add dev "$dev" parent "$handle" protocol ip prio "$prio" u32 \
        match ip src "127.0.$r.0/24" match ip dst "127.0.$s.0/24" flowid "${handle}$class"
    done
  done
  trap - ERR
  echo "$me: $rails rail(s) on $dev at $rate each, cross-rail $cross shared; addresses 127.0.1.1..127.0.$rails.1"
}

down() {
  if installed; then tc qdisc del dev "$dev" root; echo "$me: removed"; else echo "$me: nothing installed"; fi
}

status() {
  installed || { echo "$me: not installed"; return 0; }
  # One line per class: id, what it is (from its minor number), rate, bytes sent.
  tc -s class show dev "$dev" | awk -v h="$handle" '
    /^class htb/ {
      c = $3; minor = substr(c, length(h) + 1); rate = ""
      for (i = 1; i < NF; i++) if ($i == "rate") rate = $(i + 1)
      if (minor == "1") what = "all of lo (parent)"
      else if (minor == "999") what = "default: unshaped"
      else if (minor == "99") what = "cross-rail (shared)"
      else what = sprintf("same rail: 127.0.%d.0/24", minor - 10)
    }
    /Sent/ { printf "%-9s %-32s %-9s %14s bytes\n", c, what, rate, $2 }'
}

bench() {
  installed || echo "$me: warning: rails are not shaped (scripts/rails-tc.sh up)" >&2
  local bin=${RAILNET_BENCH:-build/plugin/tools/railnet-bench}
  [ -x "$bin" ] || die "no $bin (scripts/build.sh build, or set RAILNET_BENCH)"
  RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1 "$bin" --device lo@127.0.1.1+lo@127.0.2.1 --against lo@127.0.1.1 "$@"
}

[ "$(id -u)" -eq 0 ] || die "needs root (tc)"
command -v tc > /dev/null || die "tc not found (apt-get install iproute2)"
case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  bench) shift; bench "$@" ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
esac
