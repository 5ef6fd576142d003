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
    # The machine's 1-minute load average every 30 s (runs before loadavg.txt existed have none).
    path = os.path.join(folder, "loadavg.txt")
    if os.path.exists(path):
        with open(path) as f:
            conditions["loadavg"] = [float(line.split()[1]) for line in f if len(line.split()) >= 2]
    return procs, samples, books, conditions


def errors_per_window(samples):
    out, before = [], {}
    for s in samples:
        now = s["errors"]
        out.append(sum(v - before.get(k, 0) for k, v in now.items()))
        before = now
    return out


def p99_of(samples, lo, hi, kind):
    vals = [s[kind]["p99_ms"] for s in samples if lo <= s["t"] < hi and s[kind]["count"] > 0]
    return max(vals) if vals else 0.0, (sorted(vals)[len(vals) // 2] if vals else 0.0)


def fit(points):
    """Least squares v = a + b·t over points [(t, v)]: (a, b, standard error of b). The
    samples are 10 s apart and the churn makes them swing together for minutes, so the
    plain standard error is too small: it is widened by the residuals' lag-1 autocorrelation
    r (effective sample count n·(1 − r)/(1 + r))."""
    n = len(points)
    if n < 3:
        return (points[0][1] if points else 0.0), 0.0, float("nan")
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    b = sum((t - mt) * (v - mv) for t, v in points) / sxx if sxx else 0.0
    a = mv - b * mt
    res = [v - (a + b * t) for t, v in points]
    s2 = sum(e * e for e in res) / (n - 2)
    var_res = sum(e * e for e in res)
    r1 = sum(res[i] * res[i - 1] for i in range(1, n)) / var_res if var_res else 0.0
    r1 = max(0.0, min(r1, 0.99))
    n_eff = max(3.0, n * (1 - r1) / (1 + r1))
    se = (s2 / sxx) ** 0.5 * (n / n_eff) ** 0.5 if sxx else float("nan")
    return a, b, se


def median(vals):
    vals = sorted(vals)
    if not vals:
        return float("nan")
    m = len(vals) // 2
    return vals[m] if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2


def loaded_span(series):
    """The samples after the warm-up and while the load ran (the last ones come after the
    generator stopped and are its verification, not the soak)."""
    loaded = [s["t"] for s in series if s["robots"] > 0]
    stop = max(loaded) - 30 if loaded else series[-1]["t"]
    return [s for s in series if WARM_UP <= s["t"] <= stop] or series


def growth(series, key):
    """The growth of one measure over the loaded span: the fit (per hour, % of the fitted
    value at the end of the warm-up, ± one standard error), the plateau medians of its first
    and last 10 minutes, and the old two-point difference."""
    span = loaded_span(series)
    t0 = span[0]["t"]
    a, b, se = fit([(s["t"], s[key]) for s in span])
    start = a + b * t0
    per_hour = b * 3600 / start * 100 if start else 0.0
    per_hour_se = se * 3600 / start * 100 if start else float("nan")
    first = median([s[key] for s in span if s["t"] < t0 + 600])
    last = median([s[key] for s in span if s["t"] > span[-1]["t"] - 600])
    return {
        "start": start, "per_hour": per_hour, "se": per_hour_se,
        "fit_line": (a, b, t0, span[-1]["t"]),
        "first10": first, "last10": last,
        "plateau": (last - first) / first * 100 if first else 0.0,
        "two_point": (span[-1][key] - span[0][key]) / span[0][key] * 100 if span[0][key] else 0.0,
        "min": min(s[key] for s in span), "max": max(s[key] for s in span),
        "minutes": (span[-1]["t"] - t0) / 60,
    }


GROWTH_GOAL = 2.0  # % per hour after the warm-up (issue 42); also what "flat" is held to


def figures(procs, samples, books, conditions):
    end = max(s["t"] for s in samples) if samples else 0
    lines = []
    ok_all = True
    lines.append(f"Run: {conditions.get('minutes', '?')} min on {conditions.get('nodes', '?')} node(s), "
                 f"{conditions.get('robots', '?')} robots, churn every ~{conditions.get('churn_secs', '?')} s, "
                 f"{conditions.get('cores', '?')} cores shared with other work, binaries {conditions.get('binaries', '?')}, "
                 f"started {conditions.get('started', '?')}"
                 + (f", load average at the end {conditions['load_average_at_end']}" if 'load_average_at_end' in conditions else "")
                 + ".")
    if conditions.get("loadavg"):
        la = conditions["loadavg"]
        lines.append("")
        lines.append(f"Machine load average (1 min, every 30 s) during the run: median {median(la):.1f}, "
                     f"min {min(la):.1f}, max {max(la):.1f} on {conditions.get('cores', '?')} cores.")
    lines.append("")
    lines.append("Growth after the 5-minute warm-up, while the load ran. *fit*: least squares over every 10 s "
                 "sample, the slope per hour as % of the fitted value at 5 min, ± one standard error (widened "
                 "for the samples' autocorrelation); *plateaus*: medians of the first and last 10 minutes of "
                 "that span; *two points*: the first sample against the last (the old figure, at the mercy of "
                 "where the churn stands at either end).")
    lines.append("")
    lines.append("| node | measure | fitted at 5 min | fit, per hour | plateaus: first 10 min → last 10 min | two points | min–max |")
    lines.append("|---|---|---|---|---|---|---|")
    for node, series in sorted(procs.items()):
        for key, name, unit, fmt in (("rss_mb", "RSS", " MB", "{:.1f}"), ("fds", "open files", "", "{:.0f}"),
                                     ("tasks", "tokio tasks", "", "{:.0f}")):
            g = growth(series, key)
            f = lambda v: fmt.format(v) + unit
            lines.append(f"| {node} | {name} | {f(g['start'])} | {g['per_hour']:+.1f} % ± {g['se']:.1f} | "
                         f"{f(g['first10'])} → {f(g['last10'])} ({g['plateau']:+.1f} %) | {g['two_point']:+.1f} % | "
                         f"{f(g['min'])}–{f(g['max'])} |")
            if key in ("rss_mb", "fds"):
                ok_all &= g["per_hour"] <= GROWTH_GOAL
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
    ok_all &= not breaches and conditions.get("logs_with_a_panic", 0) == 0
    lines.append("")
    lines.append(f"Goals (RSS and open files ≤ {GROWTH_GOAL:.0f} % per hour by the fit, p99 ratios ≤ 1.2, no breach, "
                 f"no panic) met: {'yes' if ok_all else 'no (see above)'}")
    return "\n".join(lines) + "\n", ok_all


def svg(procs, samples):
    W, H, PAD, PANEL = 900, 200, 50, 5
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    def panel(title, lines_, unit, fits=()):
        return (title, lines_, unit, fits)

    def fits(key):
        # The least-squares line of each node over the span the growth figures use, dashed.
        out = []
        for _, ser in sorted(procs.items()):
            a, b, t0, t1 = growth(ser, key)["fit_line"]
            out.append([(t0, a + b * t0), (t1, a + b * t1)])
        return out
    t_max = max([s["t"] for s in samples] + [1])
    ps = [
        panel("RSS per node", [(f"node {n}", [(s["t"], s["rss_mb"]) for s in ser]) for n, ser in sorted(procs.items())], "MB",
              fits("rss_mb")),
        panel("open files per node", [(f"node {n}", [(s["t"], s["fds"]) for s in ser]) for n, ser in sorted(procs.items())], "",
              fits("fds")),
        panel("tokio tasks per node", [(f"node {n}", [(s["t"], s["tasks"]) for s in ser]) for n, ser in sorted(procs.items())], "",
              fits("tasks")),
        panel("p99 per 10 s window", [("relay", [(s["t"], s["relay"]["p99_ms"]) for s in samples]),
                                      ("ARP call", [(s["t"], s["arp"]["p99_ms"]) for s in samples])], "ms"),
        panel("errors per 10 s window", [("errors", list(zip([s["t"] for s in samples], errors_per_window(samples))))], ""),
    ]
    total_h = len(ps) * (H + PAD) + PAD
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{total_h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{total_h}" fill="white"/>']
    for k, (title, lines_, unit, fit_lines) in enumerate(ps):
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
        for j, pts in enumerate(fit_lines):
            coords = " ".join(f"{x0 + (x1 - x0) * t / t_max:.1f},{y0 + H - H * v / vmax:.1f}" for t, v in pts)
            out.append(f'<polyline points="{coords}" fill="none" stroke="black" stroke-width="1" '
                       f'stroke-dasharray="5,3"/>')
        if fit_lines:
            out.append(f'<text x="{x1 + 10}" y="{y0 + H - 6}">- - fit after 5 min</text>')
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
