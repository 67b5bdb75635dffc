#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log by kernel name.

Usage: ncu_summary.py LOG [--per N]: each kernel's launch count, mean and total time, and the
total divided by N (e.g. the number of layers the profiled launches cover) as a per-layer figure.
"""
import argparse
import collections
import csv
import io

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--per", type=float, default=1.0, help="divide totals by this (layers covered)")
    a = ap.parse_args()
    text = open(a.log, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit("no ncu CSV header in " + a.log)
    times = collections.defaultdict(list)
    grids = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0]
        us = float(row["Metric Value"].replace(",", "")) * UNITS.get(row["Metric Unit"], 1.0)
        times[name].append(us)
        grids[name] = (row.get("Grid Size", ""), row.get("Block Size", ""))
    total = sum(sum(v) for v in times.values())
    print(f"{'kernel':40} {'launches':>8} {'mean us':>9} {'total/per':>10}  grid block")
    for name, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:40} {len(v):8} {sum(v) / len(v):9.2f} {sum(v) / a.per:10.2f}  {grids[name][0]} {grids[name][1]}")
    print(f"{'all':40} {sum(len(v) for v in times.values()):8} {'':9} {total / a.per:10.2f}")


if __name__ == "__main__":
    main()
