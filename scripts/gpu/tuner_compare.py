#!/usr/bin/env python3
"""Compares a tuner sweep (scripts/gpu/tuner-sweep.sh OUT): per collective and size, the tuner's speed against
the best forced algorithm/protocol and against NCCL's default (no tuner). Ratios are speed ratios (time of the
reference / time with the tuner): >= 1 means the tuner is at least as fast. Times are the mean of nccl-tests'
out-of-place and in-place columns.
  tuner_compare.py OUT [--csv FILE] [--ranks N]   (N: ranks of the sweep, default 2)"""
import glob
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nccl_tests_log import rows  # noqa: E402


def times(path):
    out = {}
    if not os.path.exists(path):
        return out
    for size, values in rows(path):
        samples = [v for v in (values[0], values[4] if len(values) > 4 else float("nan")) if v == v and v > 0]
        if samples:
            out[size] = sum(samples) / len(samples)
    return out


PICK = re.compile(r"NCCL INFO \w+: (\d+) Bytes -> Algo (\w+) proto (\w+)")
NAMES = {"RING": "Ring", "TREE": "Tree", "PAT": "PAT", "LL": "LL", "LL128": "LL128", "SIMPLE": "Simple"}


def picks(out, coll):
    """What NCCL ran with the tuner on, per size (rank 0's TUNING lines from the untimed tuner-picks pass): nccl-tests' byte
    count is per rank for all_gather/reduce_scatter (see pick_for)."""
    found = {}
    for path in glob.glob(os.path.join(out, "tuner-picks", coll + ".rank0.nccl.txt")):
        with open(path, errors="replace") as log:
            for line in log:
                m = PICK.search(line)
                if m:
                    found[int(m.group(1))] = NAMES.get(m.group(2), m.group(2)) + "_" + NAMES.get(m.group(3), m.group(3))
    return found


def pick_for(found, size, coll, nranks):
    # NCCL logs all_gather's and reduce_scatter's per-rank byte count; nccl-tests' row size is the total.
    per_rank = coll in ("all_gather", "reduce_scatter")
    return found.get(size // nranks if per_rank else size, "?")


def geomean(values):
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main():
    out = sys.argv[1]
    csv_path = sys.argv[sys.argv.index("--csv") + 1] if "--csv" in sys.argv else os.path.join(out, "compare.csv")
    nranks = int(sys.argv[sys.argv.index("--ranks") + 1]) if "--ranks" in sys.argv else 2
    colls = sorted({os.path.basename(p)[:-4] for p in glob.glob(os.path.join(out, "tuner", "*.log"))})
    all_best, all_default, misses, noise = [], [], [], []
    with open(csv_path, "w") as csv:
        csv.write("collective,bytes,tuner_us,default_us,best_forced_us,best_forced,tuner_vs_best,tuner_vs_default\n")
        for coll in colls:
            tuner = times(os.path.join(out, "tuner", coll + ".log"))
            default = times(os.path.join(out, "default", coll + ".log"))
            forced = {}
            for path in glob.glob(os.path.join(out, "forced", coll + "__*.log")):
                forced[os.path.basename(path)[len(coll) + 2:-4]] = times(path)
            print(f"## {coll}")
            chosen = picks(out, coll)
            print(f"{'bytes':>12} {'tuner_us':>10} {'default_us':>10} {'best_us':>10} {'best_forced':>12} "
                  f"{'tuner_pick':>12} {'vs_best':>8} {'vs_default':>10}")
            coll_best, coll_default = [], []
            for size in sorted(s for s in tuner if s > 0):
                candidates = [(t[size], name) for name, t in forced.items() if size in t]
                if not candidates:
                    continue
                best_time, best_name = min(candidates)
                vs_best = best_time / tuner[size]
                vs_default = default[size] / tuner[size] if size in default else float("nan")
                coll_best.append(vs_best)
                if vs_default == vs_default:
                    coll_default.append(vs_default)
                pick = pick_for(chosen, size, coll, nranks)
                flag = ""
                if vs_best < 0.95:
                    # Same combination as the best forced run: the gap is run-to-run variance, not the choice.
                    same = pick == best_name
                    flag = "  <0.95 (same pick: variance)" if same else "  <0.95"
                    (noise if same else misses).append((coll, size, vs_best, pick, best_name))
                print(f"{size:>12} {tuner[size]:>10.1f} {default.get(size, float('nan')):>10.1f} {best_time:>10.1f} "
                      f"{best_name:>12} {pick:>12} {vs_best:>8.3f} {vs_default:>10.3f}{flag}")
                csv.write(f"{coll},{size},{tuner[size]:.2f},{default.get(size, float('nan')):.2f},{best_time:.2f},"
                          f"{best_name},{vs_best:.4f},{vs_default:.4f}\n")
            print(f"geo-mean {coll}: tuner/best-forced {geomean(coll_best):.3f}, tuner/default {geomean(coll_default):.3f}\n")
            all_best += coll_best
            all_default += coll_default
    print(f"geo-mean all: tuner/best-forced {geomean(all_best):.3f}, tuner/default {geomean(all_default):.3f}")
    print(f"sizes below 0.95x best forced: {len(misses) + len(noise)} of {len(all_best)}; of these {len(noise)} ran "
          f"the best forced combination itself (variance), {len(misses)} chose another:"
          + "".join(f"\n  {c} {s} B: {r:.3f} (tuner {p}, best forced {b})" for c, s, r, p, b in misses))


if __name__ == "__main__":
    main()
