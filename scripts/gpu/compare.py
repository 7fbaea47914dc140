#!/usr/bin/env python3
"""Turns bench-vs-socket.sh's CSVs into railnet/Socket ratio tables (markdown) and the CPU cost line."""
import csv
import glob
import math
import os
import re
import sys

COLLECTIVES = ["all_reduce", "alltoall", "sendrecv"]


def load(path):
    with open(path) as handle:
        return {int(row["size"]): row for row in csv.DictReader(handle)}


def human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def cpu_per_gb(log_prefix):
    """Sums the 'TCP helper threads moved X GB using Y s of CPU' lines railnet logs at shutdown, over the
    NCCL debug files of every rank (LOG_PREFIX.nccl.<pid>)."""
    moved = cpu = 0.0
    pattern = re.compile(r"moved ([0-9.]+) GB using ([0-9.]+) s of CPU")
    for path in glob.glob(log_prefix + ".nccl.*"):
        with open(path, errors="replace") as log:
            for line in log:
                match = pattern.search(line)
                if match:
                    moved += float(match.group(1))
                    cpu += float(match.group(2))
    return (cpu / moved, moved, cpu) if moved > 0 else None


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "machine.txt")) as machine:
        print(machine.read().strip().lstrip("# "))
    for coll in COLLECTIVES:
        data = {t: load(os.path.join(out, f"{coll}-{t}.csv")) for t in ("railnet", "socket", "socket4x4")}
        print(f"\n### {coll} (busbw GB/s; time us for small sizes)\n")
        print("| size | railnet busbw | Socket busbw | Socket 4x4 busbw | railnet / best Socket | "
              "railnet us | best Socket us | time ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for size in sorted(data["railnet"]):
            rows = [data[t].get(size) for t in ("railnet", "socket", "socket4x4")]
            if any(row is None for row in rows):
                continue
            bw = [float(row["busbw"]) for row in rows]
            us = [float(row["time_us"]) for row in rows]
            best_bw = max(bw[1], bw[2])
            best_us = min(us[1], us[2])
            ratio = bw[0] / best_bw if best_bw > 0 else math.nan
            print(f"| {human(size)} | {bw[0]:.2f} | {bw[1]:.2f} | {bw[2]:.2f} | {ratio:.2f} | "
                  f"{us[0]:.1f} | {best_us:.1f} | {us[0] / best_us:.2f} |")
        cost = cpu_per_gb(os.path.join(out, f"{coll}-railnet"))
        if cost:
            print(f"\nrailnet helper-thread CPU: {cost[0]:.3f} s per GB moved ({cost[1]:.1f} GB, {cost[2]:.1f} s)")


if __name__ == "__main__":
    main()
