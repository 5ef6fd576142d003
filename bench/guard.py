#!/usr/bin/env python3
"""Fails when our relay falls behind the bare relay by more than a stated floor.

    bench/guard.py RESULTS_JSON FLOOR [BENCHMARK]

Reads a `signalling-bench run` results.json and compares throughput of "ours" with the
bare tokio-tungstenite relay measured in the same run (a ratio, so a slow or busy machine
moves both). Exit 1 below the floor, 2 when the figures are missing.
"""
import json
import sys


def throughput(results, benchmark, target):
    for row in results:
        if (
            row["benchmark"] == benchmark
            and row["target"] == target
            and row["metric"] == "throughput"
        ):
            return row["value"]
    return None


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, floor = sys.argv[1], float(sys.argv[2])
    benchmark = sys.argv[3] if len(sys.argv) == 4 else "relay 250 B, saturated"
    with open(path, encoding="utf-8") as f:
        results = json.load(f)["results"]
    ours = throughput(results, benchmark, "ours")
    bare = throughput(results, benchmark, "bare relay (Rust)")
    if not ours or not bare:
        print(f"guard: no throughput for ours and the bare relay in {benchmark!r}", file=sys.stderr)
        return 2
    ratio = ours / bare
    verdict = "ok" if ratio >= floor else "BELOW THE FLOOR"
    print(f"guard: {benchmark}: ours {ours:.0f} msgs/s, bare {bare:.0f} msgs/s, ratio {ratio:.2f} (floor {floor:.2f}) {verdict}")
    return 0 if ratio >= floor else 1


if __name__ == "__main__":
    sys.exit(main())
