#!/usr/bin/env bash
# Prepares the soft-RoCE (rdma_rxe) qemu rig used by tests/rxe/run-in-guest.sh:
#   1. installs the host packages (apt-get, only the missing ones),
#   2. downloads Debian's stock kernel package and unpacks it (never installs it) into build-rxe/,
#   3. builds a small initramfs (busybox-static + the modules rxe needs + an init script).
# Everything is cached under <repo>/build-rxe/ (git-ignored); a second run does nothing.
# The initramfs is rebuilt when this script, the kernel or busybox changes.
#   tests/rxe/prepare.sh              prepare (idempotent); prints what it did on stderr
#   tests/rxe/prepare.sh --print-env  also prints RXE_KERNEL=... RXE_INITRD=... on stdout
# Environment: RAILNET_RXE_CACHE (default <repo>/build-rxe), RAILNET_RXE_KERNEL_PKG (pin a
# linux-image-* package instead of the one linux-image-amd64 depends on).
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/../.." && pwd)
cache=${RAILNET_RXE_CACHE:-$repo/build-rxe}
print_env=0
case "${1:-}" in
  --print-env) print_env=1 ;;
  "") ;;
  *) echo "usage: $0 [--print-env]" >&2; exit 2 ;;
esac

say() { echo "rxe-prepare: $*" >&2; }
die() { echo "rxe-prepare: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (apt-get, and qemu's 9p export of / as root)"
[ "$(uname -m)" = x86_64 ] || die "x86-64 hosts only (the guest kernel is Debian's amd64 one)"

# ---------------------------------------------------------------------------------------------
# 1. Host packages.
packages=(qemu-system-x86 busybox-static cpio kmod rdma-core ibverbs-utils ibverbs-providers
          perftest libibverbs-dev iproute2 xz-utils zstd)
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
    say "apt-get install failed; running apt-get update and retrying"
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
fi

# ---------------------------------------------------------------------------------------------
# 2. Kernel: Debian's stock linux-image, unpacked into $cache/kernel/<version>.
mkdir -p "$cache/kernel"
kernel_link=$cache/kernel/current
if [ -n "${RAILNET_RXE_KERNEL_PKG:-}" ]; then
  want_pkg=$RAILNET_RXE_KERNEL_PKG
elif [ -e "$kernel_link/.complete" ]; then
  want_pkg=$(cat "$kernel_link/.package")
else
  want_pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)
  if [ -z "$want_pkg" ]; then
    say "apt-cache knows no linux-image-amd64; running apt-get update"
    apt-get update -qq >&2
    want_pkg=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)
  fi
  [ -n "$want_pkg" ] || die "cannot tell which linux-image-*-amd64 package linux-image-amd64 depends on"
fi
kver=${want_pkg#linux-image-}
kroot=$cache/kernel/$kver
if [ ! -e "$kroot/.complete" ]; then
  say "downloading and unpacking $want_pkg into $kroot"
  rm -rf "$kroot" "$cache/kernel/deb"
  mkdir -p "$cache/kernel/deb"
  # apt-get download writes into the current directory; _apt may not be able to write there,
  # so apt falls back to downloading as root (a harmless warning, filtered out).
  (cd "$cache/kernel/deb" && apt-get download -qq "$want_pkg" 2>&1 | grep -v 'unsandboxed' >&2 || true)
  deb=$(ls "$cache/kernel/deb"/*.deb 2>/dev/null | head -1)
  if [ -z "$deb" ]; then
    say "download failed; running apt-get update and retrying"
    apt-get update -qq >&2
    (cd "$cache/kernel/deb" && apt-get download -qq "$want_pkg" 2>&1 | grep -v 'unsandboxed' >&2 || true)
    deb=$(ls "$cache/kernel/deb"/*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || die "apt-get download $want_pkg failed"
  fi
  mkdir -p "$kroot.tmp"
  dpkg-deb -x "$deb" "$kroot.tmp"
  [ -d "$kroot.tmp/lib/modules/$kver" ] || die "$deb has no lib/modules/$kver"
  depmod -b "$kroot.tmp" "$kver"
  echo "$want_pkg" > "$kroot.tmp/.package"
  touch "$kroot.tmp/.complete"
  mv "$kroot.tmp" "$kroot"
  rm -rf "$cache/kernel/deb"
fi
ln -sfn "$kver" "$kernel_link"
vmlinuz=$kroot/boot/vmlinuz-$kver
[ -f "$vmlinuz" ] || die "missing $vmlinuz"

# ---------------------------------------------------------------------------------------------
# 3. Initramfs.
# Modules, in this order; each one's own dependencies come from modules.dep and load first.
#   crc32_generic: rxe computes its ICRC with crypto "crc32"; without it `rdma link add` fails
#                  with "No such file or directory".
#   virtio_pci, 9pnet_virtio, 9p: the host's root over virtio-9p.  virtio_console: the
#   command's stdout and stderr reach the host through virtio-serial ports.
#   veth, rdma_rxe: the soft-RoCE device.  rdma_ucm: librdmacm (optional; perftest -R).
#   bridge: run-in-guest.sh --rxe-count 2..4 puts the devices' veths on one bridge.
#   nf_tables, nft_compat, x_tables, xt_tcpudp, ip_tables, iptable_filter: iptables (nft or legacy) for the
#                  conformance group host_loss, which drops a connection's segments in the guest.
modules=(crc32_generic virtio_pci virtio_console 9pnet_virtio 9p veth bridge rdma_rxe rdma_ucm
         nf_tables nft_compat x_tables xt_tcpudp ip_tables iptable_filter)
busybox=$(command -v busybox) || die "busybox not found"

initrd=$cache/initramfs-$kver.cpio.gz
stamp_want=$( { sha256sum "${BASH_SOURCE[0]}" "$busybox" | cut -d' ' -f1; echo "$kver"; } | sha256sum | cut -d' ' -f1)
if [ -f "$initrd" ] && [ "$(cat "$initrd.stamp" 2>/dev/null)" = "$stamp_want" ]; then
  :
else
  say "building $initrd"
  work=$(mktemp -d "$cache/initramfs.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work"/{bin,dev,proc,sys,host,share,lib/modules/"$kver"}
  cp "$busybox" "$work/bin/busybox"
  : > "$work/modules.order"
  declare -A seen=()
  for m in "${modules[@]}"; do
    lines=$(modprobe -d "$kroot" -S "$kver" --show-depends "$m") || die "no module $m in $kver"
    while read -r kind path _; do
      [ "$kind" = insmod ] || continue       # "builtin X": nothing to load
      [ -z "${seen[$path]:-}" ] || continue
      seen[$path]=1
      name=$(basename "$path")
      case "$name" in
        *.ko)     cp "$path" "$work/lib/modules/$kver/$name" ;;
        *.ko.xz)  name=${name%.xz};  xz -dc "$path" > "$work/lib/modules/$kver/$name" ;;
        *.ko.zst) name=${name%.zst}; zstd -qdc "$path" > "$work/lib/modules/$kver/$name" ;;
        *.ko.gz)  name=${name%.gz};  gzip -dc "$path" > "$work/lib/modules/$kver/$name" ;;
        *) die "unexpected module file $path" ;;
      esac
      echo "$name" >> "$work/modules.order"
    done <<< "$lines"
  done
  echo "$kver" > "$work/kver"

  # The guest's /init (busybox ash). Its per-run settings come from /share/guest.conf, written by
  # run-in-guest.sh into a host temp dir that qemu exports read-write as mount tag "share".
  cat > "$work/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# Everything this script says goes to the serial console (a log file on the host).
say() { echo "rxe-init: $*"; }
finish() {
  # $1: status to report to the host when the run never got as far as writing its own
  [ -d /share ] && [ ! -s /share/status ] && echo "$1" > /share/status
  sync
  echo "RAILNET_RXE_INIT_DONE status=$1"
  poweroff -f; sleep 5; reboot -f
}
fail() {
  say "FAILED: $*"
  dmesg | tail -n 40
  if [ -f /share/guest.conf ]; then
    { echo "rxe-init: guest setup FAILED: $*"; echo "--- guest dmesg (tail) ---"; dmesg | tail -n 40; } > /share/setup-error
  fi
  finish 125
}
kver=$(cat /kver)
for m in $(cat /modules.order); do
  insmod "/lib/modules/$kver/$m" || fail "insmod $m"
done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none share /share || fail "mount share"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose,ro host /host || fail "mount host root"
. /share/guest.conf || fail "read /share/guest.conf"
mount -t proc proc /host/proc || fail "mount /host/proc"
mount -t sysfs sysfs /host/sys || fail "mount /host/sys"
mount -t devtmpfs devtmpfs /host/dev || fail "mount /host/dev"
mkdir -p /host/dev/pts /host/dev/shm 2>/dev/null
mount -t devpts -o newinstance,ptmxmode=0666 devpts /host/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm || fail "mount /host/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs /host/tmp || fail "mount /host/tmp"
mount -t tmpfs -o mode=755 tmpfs /host/run || fail "mount /host/run"
# The share appears inside the chroot at the same path as on the host.
mkdir -p "/host$SHARE_PATH" 2>/dev/null
mount -o bind /share "/host$SHARE_PATH" || fail "bind $SHARE_PATH"
# Read-write host directories (tags rw0, rw1, ...), at their host paths.
i=0
while [ "$i" -lt "$RW_COUNT" ]; do
  eval "p=\$RW_PATH_$i"
  mkdir -p "/host$p" 2>/dev/null
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=mmap "rw$i" "/host$p" || fail "mount rw $p"
  i=$((i + 1))
done
# virtio-serial ports named "out" and "err" carry the command's stdout and stderr.
out=; err=
for d in /sys/class/virtio-ports/*; do
  case "$(cat "$d/name" 2>/dev/null)" in
    out) out=/dev/${d##*/} ;;
    err) err=/dev/${d##*/} ;;
  esac
done
[ -n "$out" ] && [ -n "$err" ] || fail "no virtio-serial ports named out/err"
say "booted; running the command"
chroot /host /bin/bash "$SHARE_PATH/runner.sh" < /dev/null > "$out" 2> "$err"
st=$?
sync
finish "$st"
INIT
  chmod 755 "$work/init"
  (cd "$work" && find . -mindepth 1 ! -name "$(basename "$initrd")" | sort | cpio -o -H newc --quiet) \
    | gzip -6 > "$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  echo "$stamp_want" > "$initrd.stamp"
  rm -rf "$work"
  trap - EXIT
fi

if [ "$print_env" = 1 ]; then
  echo "RXE_KERNEL=$vmlinuz"
  echo "RXE_INITRD=$initrd"
  echo "RXE_KVER=$kver"
fi
