#!/usr/bin/env bash
# Tuner sweep on a GPU machine through railnet: 2 ranks as 2 fake hosts (NCCL_HOSTID, scripts/gpu/env.sh).
#   scripts/gpu/tuner-sweep.sh PLUGIN_SO NCCL_TESTS_BIN_DIR OUT_DIR [--quick]
# (a) every algorithm/protocol NCCL allows, forced (NCCL_ALGO/NCCL_PROTO, no tuner): OUT/forced/COLL__ALGO_PROTO.log
# (b) NCCL's own choice, no tuner (NCCL_TUNER_PLUGIN=none):                         OUT/default/COLL.log
#     right after it, railnet's tuner as users get it (found in the net .so, no calibration file, no
#     RAILNET_TUNER* set; docs/decisions.md D63):                                    OUT/tuner-nocal/COLL.log
#     -> OUT/compare-nocal.txt: per size NCCL's default time / the tuner's (goal >= 0.97 at every size)
#     railnet-tune calibrate OUT/forced/*.log -> OUT/calibration.csv
# (c) railnet's tuner on, found in the net .so, with that calibration:              OUT/tuner/COLL.log
#     and once more untimed, logging what NCCL ran per size:                       OUT/tuner-picks/COLL.log
# (d) one all_reduce with the tuner loaded by name (NCCL_TUNER_PLUGIN=railnet):      OUT/tuner-by-name/
# then scripts/gpu/tuner_compare.py OUT > OUT/compare.txt. It never builds nccl-tests.
# RAILNET_TUNE: the railnet-tune binary (default: next to the .so in a build dir, else on PATH).
# SWEEP_COLLS: collectives (default all_reduce all_gather reduce_scatter broadcast).
# SWEEP_CHANNELS: optional channel counts (e.g. "2 8"): each forced combination runs again per count with
#   NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=N, so the calibration can choose channels too (multiplies the time).
# LL_MAX: largest size for forced LL runs (default 64M): LL moves ~1 GB/s over TCP, so its 1 GiB rows cost
#   ~15 s each and never win; above LL_MAX the tuner simply has no LL measurement and never picks LL.
# NOCAL_ONLY=1: only (b) and the uncalibrated tuner (no forced runs, no calibration): the do-no-harm check.
# NOCAL_REPEATS: how many times (b) and the uncalibrated tuner run, alternating (default 1); repeats go to
#   COLL.repK.log and compare-nocal takes each side's fastest run per size, so one-off outliers drop out.
set -euo pipefail
# The tuner as users get it: loaded from the net .so with railnet's defaults. Runs that want otherwise say so.
unset NCCL_TUNER_PLUGIN RAILNET_TUNER RAILNET_TUNER_MODEL RAILNET_TUNER_FILE
PLUGIN=$(realpath "$1"); TESTS=$(realpath "$2"); OUT=$3; QUICK=${4:-}
PLUGIN_DIR=$(dirname "$PLUGIN")
here=$(dirname "$(realpath "$0")")
RANKS=${RANKS:-2}
source "$here/env.sh"
NODES=$((RANKS / ${RANKS_PER_HOST:-1}))
TUNE=${RAILNET_TUNE:-$PLUGIN_DIR/plugin/tools/railnet-tune}
[ -x "$TUNE" ] || TUNE=$(command -v railnet-tune || true)
[ -n "$TUNE" ] || { echo "railnet-tune not found: set RAILNET_TUNE" >&2; exit 2; }
max=1G
[ "$QUICK" = "--quick" ] && max=16M
# SWEEP_ITERS: timed iterations per size (nccl-tests -n; default 5). Loopback TCP varies run to run, so the
# comparison is only as good as the iteration count.
common=(-b 8 -e "$max" -f 2 -g 1 -c 0 -w 2 -n "${SWEEP_ITERS:-5}")
COLLS=${SWEEP_COLLS:-"all_reduce all_gather reduce_scatter broadcast"}
mkdir -p "$OUT"/{forced,default,tuner-nocal,tuner,tuner-picks,tuner-by-name}
summary="$OUT/sweep-summary.txt"
echo "# tuner sweep: $RANKS ranks on $NODES fake hosts, plugin $PLUGIN, NCCL from $NCCL_LIB_DIR" | tee "$summary"

# run LOG ENV... -- BINARY ARGS...: one nccl-tests run through railnet; the log starts with a railnet-tune line.
run() {
  local log=$1 header=$2; shift 2
  local start=$SECONDS status=0
  echo "# railnet-tune: $header" > "$log"
  mpirun_ranks NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=railnet "$@" >> "$log" 2>&1 || status=$?
  echo "$(basename "$log" .log) rc=$status $((SECONDS - start)) s" | tee -a "$summary"
}

# What NCCL 2.28 allows per collective (PAT only with Simple; Tree only for allreduce here).
combos() {
  case "$1" in
    all_reduce) echo "Ring:LL Ring:LL128 Ring:Simple Tree:LL Tree:LL128 Tree:Simple" ;;
    all_gather|reduce_scatter) echo "Ring:LL Ring:LL128 Ring:Simple PAT:Simple" ;;
    *) echo "Ring:LL Ring:LL128 Ring:Simple" ;;
  esac
}

# nocal_pair COLL: NCCL's default, then railnet's tuner with no calibration, NOCAL_REPEATS times.
nocal_pair() {
  local coll=$1 rep suffix
  for rep in $(seq 1 "${NOCAL_REPEATS:-1}"); do
    suffix=""; [ "$rep" -gt 1 ] && suffix=".rep$rep"
    run "$OUT/default/${coll}${suffix}.log" "coll=$coll" NCCL_DEBUG=WARN NCCL_TUNER_PLUGIN=none -- \
      "$TESTS/${coll}_perf" "${common[@]}"
    run "$OUT/tuner-nocal/${coll}${suffix}.log" "coll=$coll" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      NCCL_DEBUG_FILE="$OUT/tuner-nocal/${coll}${suffix}.rank{rank}.nccl.txt" -- "$TESTS/${coll}_perf" "${common[@]}"
  done
}

# compare_nocal: per collective and size, NCCL's default time / the uncalibrated tuner's (each side's fastest
# run when repeated); sizes below 0.97 are listed (repeat them to tell noise from harm).
compare_nocal() {
  python3 - "$OUT" "$here" <<'PY'
import glob, os, sys
out, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
from tuner_compare import times, geomean
def best(directory, coll):
    merged = {}
    paths = [os.path.join(out, directory, coll + ".log")]
    paths += sorted(glob.glob(os.path.join(out, directory, coll + ".rep*.log")))
    for path in paths:
        for size, t in times(path).items():
            merged[size] = min(t, merged.get(size, t))
    return merged
names = (os.path.basename(p) for p in glob.glob(os.path.join(out, "tuner-nocal", "*.log")))
colls = sorted(name[:-4] for name in names if ".rep" not in name)
low, everything = [], []
for coll in colls:
    tuner, default = best("tuner-nocal", coll), best("default", coll)
    ratios = []
    print(f"## {coll}\n{'bytes':>12} {'default_us':>10} {'tuner_us':>10} {'default/tuner':>13}")
    for size in sorted(s for s in tuner if s > 0 and s in default):
        ratio = default[size] / tuner[size]
        ratios.append(ratio)
        flag = "  <0.97" if ratio < 0.97 else ""
        if flag:
            low.append(f"{coll} {size} B: {ratio:.3f}")
        print(f"{size:>12} {default[size]:>10.1f} {tuner[size]:>10.1f} {ratio:>13.3f}{flag}")
    everything += ratios
    print(f"geo-mean {coll}: {geomean(ratios):.3f}, min {min(ratios, default=float('nan')):.3f}\n")
print(f"geo-mean all: {geomean(everything):.3f}; sizes below 0.97: {len(low)} of {len(everything)}"
      + "".join("\n  " + line for line in low))
PY
}

for coll in $COLLS; do
  if [ "${NOCAL_ONLY:-0}" = 1 ]; then nocal_pair "$coll"; continue; fi
  for combo in $(combos "$coll"); do
    algo=${combo%%:*}; proto=${combo##*:}
    args=("${common[@]}")
    [ "$proto" = LL ] && [ "$QUICK" != "--quick" ] && args=(-b 8 -e "${LL_MAX:-64M}" "${common[@]:4}")
    run "$OUT/forced/${coll}__${algo}_${proto}.log" "coll=$coll algo=$algo proto=$proto" \
      NCCL_DEBUG=WARN NCCL_TUNER_PLUGIN=none NCCL_ALGO="$algo" NCCL_PROTO="$proto" -- "$TESTS/${coll}_perf" "${args[@]}"
    for channels in ${SWEEP_CHANNELS:-}; do
      run "$OUT/forced/${coll}__${algo}_${proto}__ch${channels}.log" \
        "coll=$coll algo=$algo proto=$proto channels=$channels" NCCL_DEBUG=WARN NCCL_TUNER_PLUGIN=none \
        NCCL_ALGO="$algo" NCCL_PROTO="$proto" NCCL_MIN_NCHANNELS="$channels" NCCL_MAX_NCHANNELS="$channels" -- \
        "$TESTS/${coll}_perf" "${args[@]}"
    done
  done
  nocal_pair "$coll"
done

# The uncalibrated tuner must have said so, once per communicator (docs/decisions.md D63).
nocal_lines=$(cat "$OUT"/tuner-nocal/*.nccl.txt 2>/dev/null |
  grep -c "no calibration for this shape: NCCL's choice stands" || true)
echo "tuner-nocal: $nocal_lines \"no calibration for this shape: NCCL's choice stands\" lines" | tee -a "$summary"
compare_nocal | tee "$OUT/compare-nocal.txt"
[ "${NOCAL_ONLY:-0}" = 1 ] && exit 0

"$TUNE" calibrate "$OUT"/forced/*.log -o "$OUT/calibration.csv" --nodes "$NODES" | tee -a "$summary"

# Timed with NCCL's INFO log at INIT only, as the forced and default runs: NCCL's TUNING subsystem writes one
# line per collective, which costs microseconds per call. A second, untimed pass (one iteration per size)
# records what NCCL ran with the tuner (its "Bytes -> Algo .. proto .." lines) for tuner_compare.py.
for coll in $COLLS; do
  run "$OUT/tuner/${coll}.log" "coll=$coll" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
    NCCL_DEBUG_FILE="$OUT/tuner/${coll}.rank{rank}.nccl.txt" RAILNET_TUNER_FILE="$(realpath "$OUT/calibration.csv")" \
    -- "$TESTS/${coll}_perf" "${common[@]}"
  run "$OUT/tuner-picks/${coll}.log" "coll=$coll" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
    NCCL_DEBUG_FILE="$OUT/tuner-picks/${coll}.rank{rank}.nccl.txt" \
    RAILNET_TUNER_FILE="$(realpath "$OUT/calibration.csv")" -- "$TESTS/${coll}_perf" -b 8 -e "$max" -f 2 -g 1 -c 0 -w 0 -n 1
done
# By name: NCCL_TUNER_PLUGIN=railnet opens libnccl-tuner-railnet.so (PLUGIN_DIR is on LD_LIBRARY_PATH).
run "$OUT/tuner-by-name/all_reduce.log" "coll=all_reduce" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV \
  NCCL_DEBUG_FILE="$OUT/tuner-by-name/all_reduce.rank{rank}.nccl.txt" NCCL_TUNER_PLUGIN=railnet \
  RAILNET_TUNER_FILE="$(realpath "$OUT/calibration.csv")" -- "$TESTS/all_reduce_perf" -b 8 -e 16M -f 4 -g 1 -c 1 -w 1 -n 3

# Proof that NCCL loaded railnet's tuner both ways (NCCL 2.28: "TUNER/Plugin: Using railnet (v5)" and railnet's
# own "TUNER/railnet: tuner ABI v5" per communicator).
first_match() {  # first_match PATTERN FILES...: the first match, or nothing
  grep -h -o "$1" "${@:2}" 2>/dev/null | head -n 1 || true  # head may close the pipe early: not a failure
}
for dir in tuner tuner-by-name; do
  nccl_line=$(first_match 'TUNER/Plugin: Using [^ ]* (v[0-9]*)' "$OUT/$dir"/*.nccl.txt)
  railnet_line=$(first_match 'TUNER/railnet: tuner ABI v[0-9]*' "$OUT/$dir"/*.nccl.txt)
  echo "$dir: $(cat "$OUT/$dir"/*.nccl.txt 2>/dev/null | grep -c 'TUNER/railnet: tuner ABI v') tuner init lines;" \
       "${nccl_line:-no NCCL line}, ${railnet_line:-NOT LOADED}" | tee -a "$summary"
done
python3 "$here/tuner_compare.py" "$OUT" --ranks "$RANKS" | tee "$OUT/compare.txt"
