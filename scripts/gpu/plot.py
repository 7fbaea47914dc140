#!/usr/bin/env python3
"""Charts from bench-vs-socket.sh results: busbw against message size, railnet against NCCL's Socket transport
(default and best-tuned), one PNG per collective, plus one combined figure.
  python3 scripts/gpu/plot.py RESULTS_DIR OUT_DIR"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLLECTIVES = ["all_reduce", "alltoall", "sendrecv"]
TRANSPORTS = [("railnet", "railnet", "tab:red"), ("socket4x4", "NCCL Socket 4x4 (best tuned)", "tab:blue"),
              ("socket", "NCCL Socket (default)", "tab:gray")]


def load(path):
    with open(path) as handle:
        rows = [(int(r["size"]), float(r["busbw"])) for r in csv.DictReader(handle)]
    return [r for r in rows if r[0] > 0]


def draw(axis, results, coll):
    for key, label, color in TRANSPORTS:
        path = os.path.join(results, f"{coll}-{key}.csv")
        if not os.path.exists(path):
            continue
        rows = load(path)
        axis.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", markersize=3, label=label, color=color)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("message size (bytes)")
    axis.set_ylabel("bus bandwidth (GB/s)")
    axis.set_title(f"{coll}: 2 x H200 as 2 hosts over loopback TCP")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()


def main():
    results, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for coll in COLLECTIVES:
        figure, axis = plt.subplots(figsize=(7, 4.5))
        draw(axis, results, coll)
        figure.tight_layout()
        figure.savefig(os.path.join(out, f"busbw-{coll}.png"), dpi=110)
        plt.close(figure)
    figure, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for axis, coll in zip(axes, COLLECTIVES):
        draw(axis, results, coll)
    figure.tight_layout()
    figure.savefig(os.path.join(out, "busbw-railnet-vs-socket.png"), dpi=100)


if __name__ == "__main__":
    main()
