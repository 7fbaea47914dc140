#!/usr/bin/env python3
"""Reads the per-rank NCCL logs of a fusion check (nccl-rank<R>.log) and checks that railnet's fused device
spread each rank's bytes over all its NICs: every NIC named in --nics carried at least --min-share of the
rank's bytes (sent + received). Prints one line per rank; exits 1 if a rank's traffic did not spread."""
import argparse
import pathlib
import re
import sys

from rail_counters import COUNTER


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--nics", required=True, help="comma-separated NIC names of the fused device")
    parser.add_argument("--min-share", type=float, default=0.25)
    args = parser.parse_args()
    nics = args.nics.split(",")
    logs = sorted(pathlib.Path(args.directory).glob("nccl-rank*.log"),
                  key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    if not logs:
        print("no nccl-rank*.log files: was NCCL_DEBUG_FILE set?")
        return 1
    bad = 0
    for log in logs:
        per_nic = {}
        for line in log.read_text(errors="replace").splitlines():
            match = COUNTER.search(line)
            if match:
                nic, _, sent, received, _, _ = match.groups()
                per_nic[nic] = int(sent) + int(received)  # cumulative: the last report wins
        total = sum(per_nic.values())
        shares = {nic: (per_nic.get(nic, 0) / total if total else 0.0) for nic in nics}
        ok = total > 0 and all(share >= args.min_share for share in shares.values())
        bad += not ok
        detail = ", ".join(f"{nic} {per_nic.get(nic, 0)} B ({shares[nic]:.0%})" for nic in nics)
        print(f"{log.stem}: {'ok' if ok else 'NOT SPREAD'}: {total} B in all [{detail}]")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
