#!/usr/bin/env python3
"""The plot of tests/rxe/failover-timeline.sh: bandwidth over time of a verbs device fused from two soft-RoCE ports
while the link under one goes down and comes back, beside the surviving port's own rate (mode single: the single-NIC
device rxe0 moving to its standby path on rxe1 and back, beside rxe1's own rate).
  python3 tests/rxe/failover_timeline_plot.py OUT_DIR   (reads fused.csv, alone.csv, events; writes the PNG)"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    out = sys.argv[1]
    rows = {name: [(float(r["t_s"]), float(r["gbps"])) for r in csv.DictReader(open(f"{out}/{name}.csv"))]
            for name in ("alone", "fused")}
    alone = [g for t, g in rows["alone"] if t >= 0.5]
    events = dict(line.split() for line in open(f"{out}/events"))
    single = events.get("mode") == "single"
    main_label, alone_label, link = (("rxe0, single NIC with its standby path on rxe1 (verbs)", "rxe1 alone, same run",
                                      "veth0") if single else
                                     ("rxe0+rxe1 fused (verbs)", "rxe0 alone, same run", "veth1"))
    fig, axis = plt.subplots(figsize=(8, 4))
    axis.step([t for t, _ in rows["fused"]], [g * 1000 for _, g in rows["fused"]], where="post", color="tab:red",
              label=main_label)
    axis.axhline(sum(alone) / len(alone) * 1000, color="tab:blue", linestyle=":", linewidth=0.8,
                 label=alone_label)
    for name, color in (("down", "tab:gray"), ("up", "tab:green")):
        axis.axvline(float(events[name]), color=color, linestyle="--", linewidth=0.8, label=f"{link} {name}")
    axis.set_xlabel("time (s)")
    axis.set_ylabel("MB/s, 1 MiB messages one way")
    axis.set_ylim(0, None)
    axis.set_title(f"railnet verbs: {'rxe0' if single else 'rxe1'}'s link fails and returns (soft-RoCE under qemu TCG)")
    axis.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out}/verbs-{'single-' if single else ''}failover-timeline.png", dpi=130)


if __name__ == "__main__":
    main()
