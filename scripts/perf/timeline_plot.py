#!/usr/bin/env python3
"""The plot of scripts/perf/failover-timeline.sh: railnet-bench --timeline's bandwidth over time, with the moments
the plugin's WARNs name (a NIC failed, a connection moved, a NIC answers again) and the rates of one and of both NICs.
  python3 scripts/perf/timeline_plot.py TIMELINE_CSV BENCH_STDERR OUT_PNG NIC_MBPS [fused|single]"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    csv_path, err_path, png_path, mbps = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    single = len(sys.argv) > 5 and sys.argv[5] == "single"
    with open(csv_path) as handle:
        rows = [(float(r["t_s"]), float(r["gbps"])) for r in csv.DictReader(handle)]
    with open(err_path) as handle:
        events = [line.strip() for line in handle
                  if "failed;" in line or "moved to" in line or "answers again" in line]
    nic = mbps / 8000.0  # GB/s of one shaped NIC
    fig, axis = plt.subplots(figsize=(8, 4))
    label = "single-NIC device (moves to the other NIC and back)" if single else "fused device, 2 NICs"
    axis.step([t for t, _ in rows], [g for _, g in rows], where="post", color="tab:red", label=label)
    if not single:
        axis.axhline(2 * nic, color="tab:gray", linestyle="--", linewidth=0.8, label="two NICs' rate")
    axis.axhline(nic, color="tab:blue", linestyle=":", linewidth=0.8, label="one NIC's rate")
    axis.set_xlabel("time (s)")
    axis.set_ylabel("GB/s, 4 MiB messages one way")
    axis.set_ylim(0, 2.4 * nic)
    axis.set_title("railnet: its NIC fails (streams and control cut) and answers again" if single
                   else "railnet: NIC 1 fails (its streams cut) and answers again")
    text = "\n".join(e.split("NET/railnet: ", 1)[-1][:110] for e in events)
    if text:
        axis.text(0.01, 0.02, text, transform=axis.transAxes, fontsize=6, va="bottom")
    axis.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=130)


if __name__ == "__main__":
    main()
