#!/usr/bin/env python3
"""The soak's figures and plot from bench/soak.sh's output folder: figures.md (the goals of
issue 42 checked) and soak.svg (RSS, open files, tokio tasks per node; relay and ARP p99;
errors per window). No plotting library: the SVG is written by hand.

usage: soak_report.py DIR
"""
import json
import os
import sys

WARM_UP = 300  # seconds left out of the growth figures


def load(folder):
    procs = {}
    with open(os.path.join(folder, "procs.txt")) as f:
        for line in f:
            p = line.split()
            if len(p) < 8:
                continue
            t, node = int(p[0]), p[1]
            procs.setdefault(node, []).append(
                {"t": t, "rss_mb": int(p[2]) / 1024, "fds": int(p[3]), "robots": float(p[5]),
                 "sessions": float(p[6]), "tasks": float(p[7])})
    samples = []
    with open(os.path.join(folder, "samples.jsonl")) as f:
        for line in f:
            samples.append(json.loads(line))
    with open(os.path.join(folder, "books.json")) as f:
        books = json.load(f)
    conditions = {}
    path = os.path.join(folder, "conditions.json")
    if os.path.exists(path):
        with open(path) as f:
            conditions = json.load(f)
    return procs, samples, books, conditions


def errors_per_window(samples):
    out, before = [], {}
    for s in samples:
        now = s["errors"]
        out.append(sum(v - before.get(k, 0) for k, v in now.items()))
        before = now
    return out


def at(series, t):
    """The sample nearest to t."""
    return min(series, key=lambda s: abs(s["t"] - t))


def p99_of(samples, lo, hi, kind):
    vals = [s[kind]["p99_ms"] for s in samples if lo <= s["t"] < hi and s[kind]["count"] > 0]
    return max(vals) if vals else 0.0, (sorted(vals)[len(vals) // 2] if vals else 0.0)


def figures(procs, samples, books, conditions):
    end = max(s["t"] for s in samples) if samples else 0
    lines = []
    ok_all = True
    lines.append(f"Run: {conditions.get('minutes', '?')} min on {conditions.get('nodes', '?')} node(s), "
                 f"{conditions.get('robots', '?')} robots, churn every ~{conditions.get('churn_secs', '?')} s, "
                 f"{conditions.get('cores', '?')} cores shared with other work, binaries {conditions.get('binaries', '?')}, "
                 f"started {conditions.get('started', '?')}.")
    lines.append("")
    lines.append("| node | RSS at 5 min | RSS at the end of the load | growth | open files 5 min → end (min–max after warm-up) | tokio tasks 5 min → end |")
    lines.append("|---|---|---|---|---|---|")
    for node, series in sorted(procs.items()):
        # Under load only: the last samples come after the load stopped.
        loaded = [s["t"] for s in series if s["robots"] > 0]
        stop = max(loaded) - 30 if loaded else series[-1]["t"]
        after = [s for s in series if WARM_UP <= s["t"] <= stop] or series
        first, last = after[0], after[-1]
        growth = (last["rss_mb"] - first["rss_mb"]) / first["rss_mb"] * 100 if first["rss_mb"] else 0
        fds = [s["fds"] for s in after]
        lines.append(f"| {node} | {first['rss_mb']:.1f} MB | {last['rss_mb']:.1f} MB | {growth:+.1f} % | "
                     f"{first['fds']} → {last['fds']} ({min(fds)}–{max(fds)}) | {first['tasks']:.0f} → {last['tasks']:.0f} |")
        ok_all &= growth <= 2.0
    lines.append("")
    first10 = (WARM_UP, WARM_UP + 600) if end > WARM_UP + 1200 else (0, 600)
    last10 = (end - 600, end + 1)
    for kind, name in (("relay", "relay round trip"), ("arp", "ARP call round trip")):
        f_max, f_med = p99_of(samples, *first10, kind)
        l_max, l_med = p99_of(samples, *last10, kind)
        ratio = l_med / f_med if f_med else float("nan")
        lines.append(f"- {name} p99 (median of the 10 s windows): first 10 min {f_med:.1f} ms, last 10 min "
                     f"{l_med:.1f} ms, ratio {ratio:.2f} (worst window {f_max:.1f} / {l_max:.1f} ms)")
        ok_all &= ratio <= 1.2
    errors = books["errors"]
    lines.append(f"- errors by code over the run: {json.dumps(errors) if errors else 'none'}")
    c = books["counts"]
    lines.append(f"- books: {c.get('arp.calls_completed', 0)} ARP calls completed, {books['arp_keys_executed']} keys run on robots, "
                 f"{c.get('frames.robot_received', 0)} operator frames received by robots, "
                 f"{c.get('frames.operator_received', 0) + c.get('frames.viewer_received', 0)} robot frames received by people, "
                 f"{c.get('robots.logins', 0)} robot logins, {c.get('operator.sessions_opened', 0) + c.get('viewer.sessions_opened', 0)} sessions opened, "
                 f"{c.get('verify.session_records', 0)} session records checked (all ended with a reason unless a breach says otherwise)")
    breaches = books["breaches"]
    lines.append(f"- breaches: {json.dumps(breaches) if breaches else 'none'}")
    lines.append(f"- logs with a panic: {conditions.get('logs_with_a_panic', '?')}")
    ok_all &= not breaches
    lines.append("")
    lines.append(f"Goals met: {'yes' if ok_all else 'no (see above)'}")
    return "\n".join(lines) + "\n", ok_all


def svg(procs, samples):
    W, H, PAD, PANEL = 900, 200, 50, 5
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    panels = []
    for node, series in sorted(procs.items()):
        pass
    def panel(title, lines_, unit):
        return (title, lines_, unit)
    t_max = max([s["t"] for s in samples] + [1])
    ps = [
        panel("RSS per node", [(f"node {n}", [(s["t"], s["rss_mb"]) for s in ser]) for n, ser in sorted(procs.items())], "MB"),
        panel("open files per node", [(f"node {n}", [(s["t"], s["fds"]) for s in ser]) for n, ser in sorted(procs.items())], ""),
        panel("tokio tasks per node", [(f"node {n}", [(s["t"], s["tasks"]) for s in ser]) for n, ser in sorted(procs.items())], ""),
        panel("p99 per 10 s window", [("relay", [(s["t"], s["relay"]["p99_ms"]) for s in samples]),
                                      ("ARP call", [(s["t"], s["arp"]["p99_ms"]) for s in samples])], "ms"),
        panel("errors per 10 s window", [("errors", list(zip([s["t"] for s in samples], errors_per_window(samples))))], ""),
    ]
    total_h = len(ps) * (H + PAD) + PAD
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{total_h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{total_h}" fill="white"/>']
    for k, (title, lines_, unit) in enumerate(ps):
        y0 = PAD + k * (H + PAD)
        x0, x1 = 70, W - 150
        vals = [v for _, pts in lines_ for _, v in pts] or [0]
        vmax = max(vals) * 1.1 or 1
        out.append(f'<text x="{x0}" y="{y0 - 8}" font-weight="bold">{title}</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{H}" fill="none" stroke="#999"/>')
        for frac in (0, 0.5, 1):
            y = y0 + H - frac * H
            out.append(f'<text x="{x0 - 5}" y="{y + 4}" text-anchor="end">{vmax * frac:.0f}{unit and " " + unit}</text>')
        for m in range(0, int(t_max) + 1, 600):
            x = x0 + (x1 - x0) * m / t_max
            out.append(f'<line x1="{x}" y1="{y0 + H}" x2="{x}" y2="{y0 + H + 4}" stroke="#999"/>')
            out.append(f'<text x="{x}" y="{y0 + H + 16}" text-anchor="middle">{m // 60} min</text>')
        for j, (name, pts) in enumerate(lines_):
            if not pts:
                continue
            coords = " ".join(f"{x0 + (x1 - x0) * t / t_max:.1f},{y0 + H - H * v / vmax:.1f}" for t, v in pts)
            colour = colours[j % len(colours)]
            out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
            out.append(f'<text x="{x1 + 10}" y="{y0 + 15 + 16 * j}" fill="{colour}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    folder = sys.argv[1]
    procs, samples, books, conditions = load(folder)
    text, ok = figures(procs, samples, books, conditions)
    with open(os.path.join(folder, "figures.md"), "w") as f:
        f.write(text)
    with open(os.path.join(folder, "soak.svg"), "w") as f:
        f.write(svg(procs, samples))
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
