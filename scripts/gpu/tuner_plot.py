#!/usr/bin/env python3
"""Chart of a tuner sweep (tuner_compare.py's compare.csv): per collective, the tuner's speed against the best
forced algorithm/protocol and against NCCL's default, per message size.
  python3 scripts/gpu/tuner_plot.py COMPARE_CSV OUT_PNG"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    rows = defaultdict(list)
    with open(sys.argv[1]) as handle:
        for r in csv.DictReader(handle):
            rows[r["collective"]].append((int(r["bytes"]), float(r["tuner_vs_best"]), float(r["tuner_vs_default"])))
    colls = sorted(rows)
    figure, axes = plt.subplots(1, len(colls), figsize=(4.2 * len(colls), 3.6), sharey=True)
    for axis, coll in zip(axes if len(colls) > 1 else [axes], colls):
        data = sorted(rows[coll])
        sizes = [d[0] for d in data]
        axis.plot(sizes, [d[2] for d in data], "o-", color="tab:blue", markersize=3, label="tuner / NCCL default")
        axis.plot(sizes, [d[1] for d in data], "s-", color="tab:red", markersize=3, label="tuner / best forced")
        axis.axhline(1.0, color="gray", linewidth=0.8)
        axis.axhline(0.95, color="tab:red", linewidth=0.8, linestyle=":")
        axis.set_xscale("log", base=2)
        axis.set_title(coll)
        axis.set_xlabel("message size (bytes)")
        axis.grid(True, alpha=0.3)
    (axes[0] if len(colls) > 1 else axes).set_ylabel("speed ratio (>1: tuner faster)")
    (axes[0] if len(colls) > 1 else axes).legend(fontsize=8, loc="upper left")
    figure.suptitle("railnet tuner, 2 x H200 as 2 fake nodes over railnet TCP (one run)", fontsize=10)
    figure.tight_layout()
    figure.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
