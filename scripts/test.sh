#!/usr/bin/env bash
# Builds railnet and runs the whole test suite (unit tests + the conformance harness over the real .so).
#   scripts/test.sh                 normal build in ./build
#   scripts/test.sh --asan          AddressSanitizer + UBSan build in ./build-asan
#   scripts/test.sh --tsan          ThreadSanitizer build in ./build-tsan
#   scripts/test.sh --rxe           the verbs transport on real soft-RoCE: boots a qemu guest with two rxe
#                                   devices (tests/rxe/) and runs the unit tests and the conformance harness
#                                   there with RAILNET_TRANSPORT=verbs, using ./build (v12: every group,
#                                   fusion over rxe0+rxe1 included; GIN put+signal; host loss)
#   scripts/test.sh --build-only [--asan|--tsan]
#                                   builds that variant and stops (.ci/run builds the next stage's variant while a
#                                   stage tests)
# Ends with one summary line "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi
. scripts/variants.sh
build_variant ""
case "${1:-}" in
  --asan|--tsan) build_variant "$1" ;;
  --rxe)
    scripts/build.sh build
    tests/rxe/prepare.sh
    status=0
    log=$(mktemp)
    # One guest with two soft-RoCE devices. The ABI adapters do not depend on the transport and the normal TCP run
    # covers every version and group, so under TCG the groups run once, through v12, with messages up to 16 MiB
    # (soft-RoCE under TCG moves about 0.1 Gb/s; decisions D56, D71). The fusion group fuses rxe0+rxe1, which reach
    # each other through the guest's bridge and policy routing (tests/rxe/README.md).
    RAILNET_TRANSPORT=verbs tests/rxe/run-in-guest.sh --rxe-count 2 --timeout 1200 -- sh -c '
      status=0
      # Only the unit tests that use an RDMA device: the rest ran natively three times already (TCG is slow).
      build/tests/unit/railnet-unit-tests "[verbs]" || status=1
      export RAILNET_RAILS=rxe0:0,rxe1:1
      # fusion.verbs_path_failover takes these links down and up (tests/rxe/guest-runner.sh: veth<k> under rxe<k>).
      export RAILNET_TEST_RXE_NETDEVS=veth0,veth1
      # One random kill under TCG (a kill costs seconds there); the native stages run three.
      export RAILNET_TEST_KILL_TRIALS=1
      # The per-test alarm catches hangs; 120 s is a native budget. Under TCG and a parallel build, 64 verbs
      # connections set up one after another took 92 s (data.many_connections) and more with a second guest
      # beside it (docs/reliability.md "Every CI stage, many runs, under load"). A real hang still fails the stage.
      conformance="build/tests/conformance/railnet-conformance --plugin build/libnccl-net-railnet.so --max-size 16M --test-timeout 360"
      # The listener and its handling of stray connections belong to the shared handshake layer (proxy/protocol),
      # the same code under both transports: those tests run natively, three times.
      $conformance --version 12 --group basic,data,grouped,failure,lifecycle,verbs,fusion \
        --skip stray_garbage,hostile_listener,strays_at_descriptor_limit || status=1
      # The verbs control channel resumes (D94): the failover trials again (a fused device'"'"'s, and a single-NIC
      # device'"'"'s move to its standby path, D96), the control socket cut in every second frame each way
      # (RAILNET_FAULT_CONTROL_CUT, a test feature), so path frames cross re-made sockets.
      RAILNET_FAULT_CONTROL_CUT=2 $conformance --version 12 --group fusion --filter verbs_ \
        --skip verbs_all_paths_down,verbs_control_moves || status=1
      # GIN over verbs: put+signal on all three tables (the whole gin group takes ~10 minutes under TCG).
      $conformance --group gin --filter put_signal || status=1
      # A silent host and a silent RDMA path (docs/reliability.md "Host loss on verbs"): the guest is a machine of
      # its own, where iptables may drop; rxe retries for ever at RAILNET_IB_RETRY_CNT=7 (decisions D82). One rail,
      # so that connections from rxe0 to rxe1 are not routed onto rxe1 alone. Each emulated host is one of the two
      # ports, which both processes see: a standby path on the other port (D96) would outlive the emulated host'"'"'s
      # silence, so the group runs without failover (with it, a lost host is found RAILNET_FAILOVER_RESUME_MS later).
      RAILNET_RAILS=rxe0:0,rxe1:0 RAILNET_TEST_NETNS=1 RAILNET_PEER_TIMEOUT_MS=4000 RAILNET_IB_TIMEOUT=18 \
        RAILNET_IB_RETRY_CNT=6 RAILNET_FAILOVER=0 $conformance --version 12 --group host_loss || status=1
      exit $status' 2>&1 | tee "$log" || status=$?
    # Each harness run ends with its own "N passed, N failed" line: the stage reports their sum.
    passed=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | awk '{ s += $1 } END { print s + 0 }')
    failed=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | awk '{ s += $3 } END { print s + 0 }')
    runs=$(grep -cE '^[0-9]+ passed, [0-9]+ failed$' "$log" || true)
    rm -f "$log"
    [ "$runs" -eq 4 ] || { [ "$status" -eq 0 ] && status=1; }
    # The rig's own check (devices, ports, perftest traffic) only when something failed: it tells a broken rig
    # from a broken transport, and costs a second guest boot under TCG otherwise.
    if [ "$status" -ne 0 ]; then tests/rxe/smoke.sh || true; fi
    [ "$status" -ne 0 ] && [ "${failed:-0}" -eq 0 ] && failed=1
    echo "rxe (verbs on soft-RoCE): ${passed:-0} passed, ${failed:-1} failed"
    exit "$status"
    ;;
  "") ;;
  *) echo "usage: $0 [--asan|--tsan|--rxe]" >&2; exit 2 ;;
esac
scripts/build.sh "$build_dir" "${options[@]}"
[ "$build_only" -eq 1 ] && exit 0
log=$(mktemp)
status=0
meson test -C "$build_dir" --print-errorlogs --no-rebuild 2>&1 | tee "$log" || status=$?
passed=$(sed -n 's/^Ok:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -1)
failed=$(sed -n 's/^Fail:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -1)
timeouts=$(sed -n 's/^Timeout:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -1)
rm -f "$log"
failed=$(( ${failed:-0} + ${timeouts:-0} ))
[ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
echo "${build_dir}: ${passed:-0} passed, ${failed} failed"
exit "$status"
