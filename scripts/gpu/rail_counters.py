#!/usr/bin/env python3
"""Reads the per-rank NCCL logs of a rail check (nccl-rank<R>.log) and checks railnet's per-NIC counters:
rank R runs on GPU R mod ranks-per-host, and all its network bytes must go through the NIC of rail (R mod
ranks-per-host), with no cross-rail connection (with --allow-cross-rail, cross-rail connections are only
reported). With --routed, bytes on another rail's NIC are fine when that NIC carried connections routed to it
(railnet's PXN-style routing: a connection to a peer on rail r leaves from this host's rail-r NIC), and no
connection may cross rails. Prints one line per rank; exits 1 if any rank strays."""
import argparse
import pathlib
import re
import sys

COUNTER = re.compile(r"(\S+) rail (-?\d+): sent (\d+) B, received (\d+) B, (\d+) connection\(s\), (\d+) cross-rail"
                     r"(?:, (\d+) routed here)?")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--allow-cross-rail", action="store_true")
    parser.add_argument("--routed", action="store_true")
    args = parser.parse_args()
    logs = sorted(pathlib.Path(args.directory).glob("nccl-rank*.log"),
                  key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    if not logs:
        print("no nccl-rank*.log files: was NCCL_DEBUG_FILE set?")
        return 1
    bad = 0
    total_own = 0
    for log in logs:
        rank = int(re.sub(r"\D", "", log.stem))
        rail = rank % args.ranks_per_host
        per_nic = {}
        for line in log.read_text(errors="replace").splitlines():
            match = COUNTER.search(line)
            if match:
                nic, nic_rail, sent, received, conns, cross, routed = match.groups()
                # The last report wins: counters are cumulative over the process's life.
                per_nic[nic] = (int(nic_rail), int(sent), int(received), int(conns), int(cross), int(routed or 0))
        if not per_nic:
            print(f"rank {rank} (GPU {rail}): no railnet NIC counters in {log.name}")
            bad += 1
            continue
        own = sum(s + r for nr, s, r, *_ in per_nic.values() if nr == rail)
        other = sum(s + r for nr, s, r, *_ in per_nic.values() if nr != rail)
        routed_other = sum(s + r for nr, s, r, _, _, rt in per_nic.values() if nr != rail and rt > 0)
        cross = sum(x for _, _, _, _, x, _ in per_nic.values())
        detail = ", ".join(f"{nic} (rail {nr}) sent {s} B received {r} B, {c} conn, {x} cross, {rt} routed"
                           for nic, (nr, s, r, c, x, rt) in sorted(per_nic.items()))
        # A rank may carry no network bytes at all (a broadcast's ring ends at it): it has strayed only if it
        # used another rail's NIC or (unless allowed) connected across rails.
        if args.routed:
            ok = other == routed_other and cross == 0
        else:
            ok = other == 0 and (cross == 0 or args.allow_cross_rail)
        total_own += own
        bad += not ok
        print(f"rank {rank} GPU {rail}: {'ok' if ok else 'STRAYED'}: own rail {own} B, other rails {other} B, "
              f"{cross} cross-rail connection(s) [{detail}]")
    if total_own == 0:
        print("no rank moved any bytes through railnet")
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
