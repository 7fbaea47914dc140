#!/usr/bin/env python3
"""Reads nccl-tests output: `wrong LOG` prints the sum of #wrong over all rows, `rows LOG` the number of data
rows, `table LOG` the rows as CSV (size,time_us,algbw,busbw) taking the out-of-place columns."""
import re
import sys

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+(\S+\s+\S+\s+\S+\s+\S+.*)$")
NCCL_LOG = re.compile(r"[A-Za-z][\w.-]*:\d+:\d+ \[\d+\] NCCL (INFO|WARN|TRACE).*$")
ROW_START = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)(\s+\S+)?(\s+-?\d+)?\s*$")


def rows(path):
    """Yields (size, [numbers...]) for each data row; numbers are time, algbw, busbw, #wrong (out-of-place)
    then the same for in-place. alltoall/sendrecv rows have redop 'none' and root -1, same layout."""
    with open(path, errors="replace") as log:
        # NCCL's own log lines (stderr) can land in the middle of a row (stdout): cut them out, and join a row
        # start with the line that completes it.
        lines = [NCCL_LOG.sub("", line.rstrip("\n")) for line in log]
        lines = [line for line in lines if line.strip()]
    merged = []
    for line in lines:
        if merged and ROW_START.match(merged[-1]) and not ROW.match(merged[-1]) and not line.startswith("#"):
            merged[-1] += " " + line
        else:
            merged.append(line)
    for line in merged:
        match = ROW.match(line)
        if not match:
            continue
        fields = match.group(6).split()
        try:
            values = [float(f) if f not in ("N/A",) else float("nan") for f in fields]
        except ValueError:
            continue
        if len(values) >= 4:
            yield int(match.group(1)), values


def main():
    command, path = sys.argv[1], sys.argv[2]
    data = list(rows(path))
    if command == "wrong":
        total = 0
        for _, values in data:
            for column in (3, 7):  # out-of-place and in-place #wrong
                if len(values) > column and values[column] == values[column]:  # skip N/A (nan)
                    total += int(values[column])
        print(total)
    elif command == "rows":
        print(len(data))
    elif command == "table":
        print("size,time_us,algbw,busbw")
        for size, values in data:
            print(f"{size},{values[0]},{values[1]},{values[2]}")
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
