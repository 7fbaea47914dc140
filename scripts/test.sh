#!/usr/bin/env bash
# Builds railnet and runs the whole test suite (unit tests + the conformance harness over the real .so).
#   scripts/test.sh                 normal build in ./build
#   scripts/test.sh --asan          AddressSanitizer + UBSan build in ./build-asan
#   scripts/test.sh --tsan          ThreadSanitizer build in ./build-tsan
#   scripts/test.sh --rxe           the verbs transport on real soft-RoCE: boots a qemu guest with an rxe
#                                   device (tests/rxe/) and runs the unit tests and the conformance harness
#                                   there with RAILNET_TRANSPORT=verbs, using ./build (every group but
#                                   "fusion", which needs TCP loopback rails; verbs fusion is not built yet)
# Ends with one summary line "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build
options=()
case "${1:-}" in
  --asan)
    build_dir=build-asan
    options=(-Db_sanitize=address,undefined -Db_lundef=false -Dstatic_cxx_runtime=false -Dbuildtype=debug)
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    export RAILNET_TEST_MAX_SIZE=$((256 << 20))
    ;;
  --tsan)
    build_dir=build-tsan
    options=(-Db_sanitize=thread -Db_lundef=false -Dstatic_cxx_runtime=false -Dbuildtype=debugoptimized)
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
    export RAILNET_TEST_MAX_SIZE=$((64 << 20))
    ;;
  --rxe)
    scripts/build.sh build
    tests/rxe/prepare.sh
    status=0
    tests/rxe/smoke.sh || status=$?
    log=$(mktemp)
    RAILNET_TRANSPORT=verbs tests/rxe/run-in-guest.sh --timeout 1200 -- sh -c \
      'build/tests/unit/railnet-unit-tests && build/tests/conformance/railnet-conformance \
         --plugin build/libnccl-net-railnet.so --max-size 64M \
         --group basic,data,grouped,failure,lifecycle,verbs' 2>&1 | tee "$log" || status=$?
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
    rm -f "$log"
    passed=$(echo "$summary" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
    failed=$(echo "$summary" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
    [ "$status" -ne 0 ] && [ "${failed:-0}" -eq 0 ] && failed=1
    echo "rxe (verbs on soft-RoCE): ${passed:-0} passed, ${failed:-1} failed"
    exit "$status"
    ;;
  "") ;;
  *) echo "usage: $0 [--asan|--tsan|--rxe]" >&2; exit 2 ;;
esac
scripts/build.sh "$build_dir" "${options[@]}"
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
