#!/usr/bin/env python3
"""Turns bench-vs-socket.sh's CSVs into railnet/Socket ratio tables (markdown) and the CPU cost line. Each table
compares railnet with the best of the Socket configurations that ran (socket, socket4x4, socket4x4ch8) at each
size; railnet-notuner (NCCL_TUNER_PLUGIN=none) and railnet-gpu (RAILNET_TCP_GPU=1) columns appear when those
runs exist."""
import csv
import glob
import math
import os
import re
import sys

COLLECTIVES = ["all_reduce", "alltoall", "sendrecv", "all_gather", "reduce_scatter"]
SOCKETS = ["socket", "socket4x4", "socket4x4ch8"]
EXTRA = ["railnet-notuner", "railnet-gpu"]
LABELS = {"socket": "Socket", "socket4x4": "Socket 4x4", "socket4x4ch8": "Socket 4x4 ch8"}


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
        present = [t for t in ["railnet"] + EXTRA + SOCKETS
                   if os.path.exists(os.path.join(out, f"{coll}-{t}.csv"))]
        sockets = [t for t in SOCKETS if t in present]
        if "railnet" not in present or not sockets:
            continue
        data = {t: load(os.path.join(out, f"{coll}-{t}.csv")) for t in present}
        extra = [t for t in EXTRA if t in present]
        print(f"\n### {coll} (busbw GB/s; time us for small sizes)\n")
        head = ["size", "railnet busbw"] + [{"railnet-notuner": "railnet tuner off",
                                               "railnet-gpu": "railnet GPU staging"}[t] for t in extra]
        head += [f"{LABELS[t]} busbw" for t in sockets]
        head += ["railnet / best Socket", "railnet us", "best Socket us", "time ratio"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for size in sorted(data["railnet"]):
            rows = {t: data[t].get(size) for t in present}
            if any(row is None for row in rows.values()):
                continue
            bw = {t: float(row["busbw"]) for t, row in rows.items()}
            us = {t: float(row["time_us"]) for t, row in rows.items()}
            best_bw = max(bw[t] for t in sockets)
            best_us = min(us[t] for t in sockets)
            ratio = bw["railnet"] / best_bw if best_bw > 0 else math.nan
            cells = [human(size), f"{bw['railnet']:.2f}"] + [f"{bw[t]:.2f}" for t in extra]
            cells += [f"{bw[t]:.2f}" for t in sockets]
            cells += [f"{ratio:.2f}", f"{us['railnet']:.1f}", f"{best_us:.1f}", f"{us['railnet'] / best_us:.2f}"]
            print("| " + " | ".join(cells) + " |")
        cost = cpu_per_gb(os.path.join(out, f"{coll}-railnet"))
        if cost:
            print(f"\nrailnet helper-thread CPU: {cost[0]:.3f} s per GB moved ({cost[1]:.1f} GB, {cost[2]:.1f} s)")


if __name__ == "__main__":
    main()
