#!/usr/bin/env bash
# Runs a command inside a qemu guest (TCG) that has a real soft-RoCE device, rxe0, on veth0 (and up to 3 more).
#   tests/rxe/run-in-guest.sh [options] -- COMMAND [ARGS...]
# Options:
#   --timeout SEC     host-side limit for the whole run, boot included (default 600). On expiry
#                     qemu is killed and this script exits 124.
#   --cwd DIR         directory to run COMMAND in (default: the caller's cwd)
#   --rw DIR          export host DIR read-write into the guest at the same path (repeatable).
#                     The cwd is exported read-write unless --ro-cwd; the rest of the host's root
#                     is read-only in the guest; /tmp, /run and /dev/shm are guest tmpfs.
#   --ro-cwd          do not export the cwd read-write
#   --mem SIZE        guest memory (default 3G)       --smp N  guest CPUs (default 2)
#   --netdev-mtu N    MTU of the veths (default 1500, which gives rxe active_mtu 1024;
#                     4200+ gives 4096)
#   --rxe-count N     soft-RoCE devices, 1 to 4 (default 1). Device k is rxe<k> on veth<k>, 10.77.0.<k+1>. With 2+,
#                     each veth's peer is a port of one bridge and policy routing makes every device reach every
#                     other one (and itself, as with 1); see tests/rxe/README.md.
#   -v, --verbose     print the guest's setup line and the console log path
# The guest sees the host's root read-only (9p), so host-built binaries run unchanged. COMMAND
# runs as root in the guest with the caller's whole environment plus:
#   RAILNET_RXE_IN_GUEST=1 RAILNET_RXE_DEV=rxe0 RAILNET_RXE_PORT=1 RAILNET_RXE_NETDEV=veth0
#   RAILNET_RXE_IP=10.77.0.1 RAILNET_RXE_PEER_NETDEV=veth1 RAILNET_RXE_PEER_IP=10.77.0.2
#   RAILNET_RXE_GID_INDEX=<RoCE v2 GID of 10.77.0.1> RAILNET_RXE_IB_MTU=<active_mtu bytes>
#   RAILNET_RXE_DEVS=rxe0[,rxe1...] RAILNET_RXE_IPS=10.77.0.1[,10.77.0.2...] (same order)
# Its stdout/stderr stream to this script's stdout/stderr; stdin is /dev/null. Exit status:
# COMMAND's, 124 on the host-side timeout, 125 when the rig itself failed (guest setup, boot).
# Environment: RAILNET_RXE_TIMEOUT, RAILNET_RXE_MEM, RAILNET_RXE_SMP, RAILNET_RXE_NETDEV_MTU,
# RAILNET_RXE_COUNT (defaults for the options), RAILNET_RXE_KEEP=1 keeps the per-run temp dir (console log).
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
me="run-in-guest"
die() { echo "$me: $*" >&2; exit 125; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; exit 2; }

timeout_s=${RAILNET_RXE_TIMEOUT:-600}
mem=${RAILNET_RXE_MEM:-3G}
smp=${RAILNET_RXE_SMP:-2}
netdev_mtu=${RAILNET_RXE_NETDEV_MTU:-1500}
rxe_count=${RAILNET_RXE_COUNT:-1}
cwd=$PWD
ro_cwd=0
verbose=0
rw_dirs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s=$2; shift 2 ;;
    --cwd) cwd=$2; shift 2 ;;
    --rw) [ "$2" != / ] || die "--rw / is not supported"; rw_dirs+=("$2"); shift 2 ;;
    --ro-cwd) ro_cwd=1; shift ;;
    --mem) mem=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --netdev-mtu) netdev_mtu=$2; shift 2 ;;
    --rxe-count) rxe_count=$2; shift 2 ;;
    -v|--verbose) verbose=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) echo "$me: unknown option $1 (the command goes after --)" >&2; usage ;;
  esac
done
[ $# -gt 0 ] || usage
[[ "$timeout_s" =~ ^[0-9]+$ ]] && [ "$timeout_s" -gt 0 ] || die "--timeout wants a positive number of seconds"
[[ "$netdev_mtu" =~ ^[0-9]+$ ]] || die "--netdev-mtu wants a number"
[[ "$rxe_count" =~ ^[1-4]$ ]] || die "--rxe-count wants 1 to 4"
cwd=$(cd "$cwd" && pwd -P) || die "no directory $cwd"
[ "$(id -u)" -eq 0 ] || die "needs root (qemu exports the host's / over 9p)"

# Kernel + initramfs (cached; prepare.sh prints on stderr only what it does).
prep=$("$script_dir/prepare.sh" --print-env) || die "prepare.sh failed"
eval "$prep"

share=$(mktemp -d /tmp/railnet-rxe.XXXXXX)
qemu_pid=
tail_pids=()
cleanup() {
  local rc=$?
  [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null || true
  for p in "${tail_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "${RAILNET_RXE_KEEP:-0}" = 1 ]; then
    echo "$me: kept $share" >&2
  else
    rm -rf "$share"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "$me: interrupted; killing qemu" >&2; exit 130' INT
trap 'echo "$me: terminated; killing qemu" >&2; exit 143' TERM HUP

sq() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }   # single-quote for ash/bash

# Read-write exports: the cwd (unless --ro-cwd) and --rw dirs, parents before children.
rw_list=()
[ "$ro_cwd" = 1 ] || rw_list+=("$cwd")
# The repository holding this rig (its scripts and build trees) must be visible in the guest even when it
# lives under /tmp, which the guest mounts as its own tmpfs (CI clones may sit there).
rw_list+=("$(cd "$script_dir/../.." && pwd -P)")
for d in "${rw_dirs[@]}"; do
  d=$(cd "$d" && pwd -P) || die "no directory $d"
  rw_list+=("$d")
done
declare -A rw_seen=()
rw_sorted=()
while IFS= read -r d; do
  [ -n "$d" ] || continue
  case "$d" in
    /) continue ;;   # the cwd "/" stays read-only (--rw / is refused above)
    /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) die "cannot export $d read-write" ;;
  esac
  [ -z "${rw_seen[$d]:-}" ] || continue
  rw_seen[$d]=1
  rw_sorted+=("$d")
done < <(printf '%s\n' "${rw_list[@]}" | awk '{ print length($0) "\t" $0 }' | sort -n | cut -f2-)

qemu_fs=(-virtfs "local,path=/,mount_tag=host,security_model=none,multidevs=remap,readonly=on"
         -virtfs "local,path=$share,mount_tag=share,security_model=none")
{
  echo "SHARE_PATH=$(sq "$share")"
  echo "RW_COUNT=${#rw_sorted[@]}"
  i=0
  for d in "${rw_sorted[@]}"; do
    echo "RW_PATH_$i=$(sq "$d")"
    qemu_fs+=(-virtfs "local,path=${d//,/,,},mount_tag=rw$i,security_model=none,multidevs=remap")
    i=$((i + 1))
  done
} > "$share/guest.conf"
{
  echo "CWD=$(sq "$cwd")"
  echo "NETDEV_MTU=$netdev_mtu"
  echo "RXE_COUNT=$rxe_count"
  echo "VERBOSE=$verbose"
  # The caller's resource limits (the guest's init starts with the kernel's: 1024 open files).
  printf 'LIMITS='
  sq "$(for o in n l s c; do printf 'ulimit -H%s %s; ulimit -S%s %s; ' "$o" "$(ulimit -H$o)" "$o" "$(ulimit -S$o)"; done)"
  echo
} > "$share/setup.conf"
cp "$script_dir/guest-runner.sh" "$share/runner.sh"
env -0 > "$share/env"
printf '%s\0' "$@" > "$share/argv"
: > "$share/stdout"
: > "$share/stderr"
: > "$share/console.log"

# shellcheck disable=SC2054  # qemu options are comma-separated
qemu=(qemu-system-x86_64
  -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem"
  -nodefaults -no-reboot -display none -nic none
  -kernel "$RXE_KERNEL" -initrd "$RXE_INITRD"
  -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off"
  -chardev "file,id=con,path=$share/console.log" -serial chardev:con
  -device virtio-serial-pci,id=vser
  -chardev "file,id=out,path=$share/stdout" -device virtserialport,bus=vser.0,chardev=out,name=out
  -chardev "file,id=err,path=$share/stderr" -device virtserialport,bus=vser.0,chardev=err,name=err
  "${qemu_fs[@]}")

[ "$verbose" = 1 ] && echo "$me: booting ($RXE_KVER, TCG, -smp $smp -m $mem), console log $share/console.log" >&2
start=$(date +%s.%N)
# timeout(1) sends TERM, then KILL 10 s later; exits 124 when the limit was hit.
timeout -k 10 "$timeout_s" "${qemu[@]}" < /dev/null > "$share/qemu.log" 2>&1 &
qemu_pid=$!
tail -c +1 -s 0.2 -f --pid="$qemu_pid" "$share/stdout" &
tail_pids+=($!)
tail -c +1 -s 0.2 -f --pid="$qemu_pid" "$share/stderr" >&2 &
tail_pids+=($!)
qrc=0
wait "$qemu_pid" || qrc=$?
qemu_pid=
for p in "${tail_pids[@]}"; do wait "$p" 2>/dev/null || true; done
tail_pids=()
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')

console_tail() {
  echo "--- guest console (tail; qemu exit $qrc) ---" >&2
  tail -n 40 "$share/console.log" >&2
  if [ -s "$share/qemu.log" ]; then echo "--- qemu ---" >&2; tail -n 20 "$share/qemu.log" >&2; fi
}
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "$me: TIMEOUT: the guest run exceeded ${timeout_s} s (--timeout); qemu was killed" >&2
  console_tail
  exit 124
fi
if [ -s "$share/setup-error" ]; then
  cat "$share/setup-error" >&2
  exit 125
fi
if [ ! -s "$share/status" ]; then
  echo "$me: the guest ended without reporting the command's exit status (after ${elapsed} s)" >&2
  console_tail
  exit 125
fi
status=$(cat "$share/status")
[ "$verbose" = 1 ] && echo "$me: done in ${elapsed} s, exit status $status" >&2
exit "$status"
