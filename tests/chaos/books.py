#!/usr/bin/env python3
"""Prints the books of a chaos run (WORK/books*.json from signalling-bench chaos, the
process samples WORK/procs.txt) and exits 1 on any breach or a process over its bounds.

usage: books.py WORK [--rss-mb N] [--fds N]
"""
import json
import os
import sys

# Breaches the suite has found in the server and that are not fixed yet (docs/reliability.md,
# "Open findings"): printed as KNOWN, not failing the run, so the suite guards everything
# else meanwhile. Each entry: breach name, phase it may appear in ("*": any), e.g.
# CHAOS_KNOWN="two_controllers_of_one_robot@1-kill9,session_record_never_ended@*". None
# today: every breach fails the run.
KNOWN = [tuple(k.split("@")) for k in os.environ.get(
    "CHAOS_KNOWN", "").split(",") if "@" in k]

RSS_MB = 1024  # per node: far above what 300 robots cost (about 60 MB), a leak shows
FDS = 5000     # per node: sockets of every robot, person and program, plus a margin


def main():
    work = sys.argv[1]
    failed = False
    for name in sorted(os.listdir(work)):
        if not (name.startswith("books") and name.endswith(".json")):
            continue
        with open(os.path.join(work, name)) as f:
            books = json.load(f)
        print(f"--- {name}: {books.get('duration_secs')} s, load {json.dumps(books.get('load'))}")
        counts = books["counts"]
        width = max(len(k) for k in counts) if counts else 10
        for key, value in counts.items():
            print(f"  {key:<{width}} {value}")
        print("  errors by code:")
        for key, value in books["errors"].items():
            print(f"    {key}: {value}")
        print(f"  relay round trip: {json.dumps(books['relay_rtt'])}")
        print(f"  ARP call round trip: {json.dumps(books['arp_rtt'])}")
        print("  robots back online, by the phase they were cut in:")
        for phase, figures in books["back_online_by_phase"].items():
            print(f"    {phase}: {json.dumps(figures)}")
        print(f"  ARP keys run on robots: {books['arp_keys_executed']}, answered completed: {books['arp_keys_completed']}")
        print(f"  most controlling sessions one robot saw at once: {books['max_controllers_of_one_robot']}")
        breaches = books["breaches"]
        if breaches:
            print(f"  BREACHES ({len(breaches)}):")
            for key, value in breaches.items():
                phase = value["example"][1:].split("]")[0]
                known = any(key == k and p in ("*", phase) for k, p in KNOWN)
                failed |= not known
                label = "KNOWN (open finding, docs/reliability.md)" if known else "FAILS"
                print(f"    {key}: {value['count']} [{label}], e.g. {value['example'][:300]}")
        else:
            print("  breaches: none")
    procs = os.path.join(work, "procs.txt")
    if os.path.exists(procs):
        peak = {}
        with open(procs) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 4:
                    continue
                node, rss, fds = parts[1], int(parts[2]), int(parts[3])
                p = peak.setdefault(node, [0, 0])
                p[0], p[1] = max(p[0], rss), max(p[1], fds)
        print("--- processes (peak over the run)")
        for node, (rss, fds) in sorted(peak.items()):
            over = rss / 1024 > RSS_MB or fds > FDS
            print(f"  node {node}: RSS {rss / 1024:.0f} MB, open files {fds}" + ("  OVER BOUND" if over else ""))
            failed |= over
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
