//! Writes the results: JSON (everything), a markdown table with ratios, and an SVG plot.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::orchestrator::Row;

/// `value / ours` for the same benchmark and metric.
fn ratio_to_ours(rows: &[Row], row: &Row) -> Option<f64> {
    let ours = rows
        .iter()
        .find(|r| r.benchmark == row.benchmark && r.metric == row.metric && r.target == "ours")?;
    (ours.value != 0.0).then(|| row.value / ours.value)
}

fn fmt_value(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

pub fn markdown(rows: &[Row], conditions: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmark results\n");
    let _ = writeln!(out, "Conditions: `{}`\n", conditions);
    let _ = writeln!(
        out,
        "| benchmark | target | metric | value | unit | × ours | runs | p50 / p99 / p99.9 µs |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---|---:|---|---|");
    for row in rows {
        let ratio = ratio_to_ours(rows, row)
            .map(|r| format!("{r:.2}"))
            .unwrap_or_else(|| "–".into());
        let runs = if row.runs.len() > 1 {
            row.runs
                .iter()
                .map(|v| fmt_value(*v))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            String::new()
        };
        let latency = row
            .latency
            .as_ref()
            .map(|l| {
                format!(
                    "{} / {} / {}",
                    fmt_value(l.p50_us),
                    fmt_value(l.p99_us),
                    fmt_value(l.p999_us)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.benchmark,
            row.target,
            row.metric,
            fmt_value(row.value),
            row.unit,
            ratio,
            runs,
            latency
        );
    }
    out
}

/// The headline figures drawn: (benchmark, metric, panel title).
const PANELS: [(&str, &str, &str); 6] = [
    (
        "relay 250 B, saturated",
        "throughput",
        "relay 250 B saturated (msgs/s, higher is better)",
    ),
    (
        "relay 6 KB, saturated",
        "throughput",
        "relay 6 KB saturated (msgs/s, higher is better)",
    ),
    (
        "relay 250 B, fixed load",
        "p99 latency",
        "p99 at fixed load (µs, lower is better)",
    ),
    (
        "capacity",
        "RSS per idle connection",
        "RSS per idle connection (KiB, lower is better)",
    ),
    (
        "capacity",
        "CPU while idle",
        "CPU while idle (% of a core, lower is better)",
    ),
    (
        "session setup (offer → answer)",
        "rate",
        "session setup (offers/s, higher is better)",
    ),
];
const COLORS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];
const BAR_H: f64 = 18.0;
const LABEL_W: f64 = 190.0;
const WIDTH: f64 = 820.0;

/// Panels of horizontal bars, one per headline figure, one bar per target.
pub fn svg(rows: &[Row]) -> String {
    let mut targets: Vec<&str> = Vec::new();
    for row in rows {
        if !targets.contains(&row.target.as_str()) {
            targets.push(&row.target);
        }
    }
    let panel_h = 36.0 + BAR_H * targets.len() as f64 + 16.0;
    let height = panel_h * PANELS.len() as f64 + 20.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (p, panel) in PANELS.iter().enumerate() {
        let top = 10.0 + p as f64 * panel_h;
        svg_panel(&mut out, rows, &targets, *panel, top);
    }
    let _ = writeln!(out, "</svg>");
    out
}

/// One panel: its title, and a bar per target that has the figure.
fn svg_panel(
    out: &mut String,
    rows: &[Row],
    targets: &[&str],
    (benchmark, metric, title): (&str, &str, &str),
    top: f64,
) {
    let chart_w = WIDTH - LABEL_W - 110.0;
    let _ = writeln!(
        out,
        r#"<text x="10" y="{}" font-weight="bold">{}</text>"#,
        top + 16.0,
        escape(title)
    );
    let values: Vec<(usize, f64)> = targets
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            rows.iter()
                .find(|r| r.benchmark == benchmark && r.metric == metric && r.target == *t)
                .map(|r| (i, r.value))
        })
        .collect();
    let max = values
        .iter()
        .map(|(_, v)| *v)
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    for (slot, (i, value)) in values.iter().enumerate() {
        let y = top + 28.0 + slot as f64 * BAR_H;
        let w = (value / max * chart_w).max(1.0);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            LABEL_W - 6.0,
            y + 13.0,
            escape(targets[*i])
        );
        let _ = writeln!(
            out,
            r#"<rect x="{LABEL_W}" y="{y}" width="{w:.1}" height="{}" fill="{}"/>"#,
            BAR_H - 4.0,
            COLORS[i % COLORS.len()]
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}">{}</text>"#,
            LABEL_W + w + 4.0,
            y + 13.0,
            fmt_value(*value)
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn write_all(
    dir: &Path,
    rows: &[Row],
    conditions: &Value,
    profile: &Value,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = json!({"conditions": conditions, "profile": profile, "results": rows});
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(dir.join("results.md"), markdown(rows, conditions))?;
    std::fs::write(dir.join("results.svg"), svg(rows))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, value: f64) -> Row {
        Row {
            benchmark: "relay 250 B, saturated".into(),
            target: target.into(),
            metric: "throughput".into(),
            value,
            unit: "msgs/s".into(),
            runs: vec![],
            latency: None,
        }
    }

    #[test]
    fn ratios_and_outputs() {
        let rows = vec![row("ours", 1000.0), row("bare relay (Rust)", 1250.0)];
        let md = markdown(&rows, &json!({}));
        assert!(md.contains("| relay 250 B, saturated | bare relay (Rust) | throughput | 1250 | msgs/s | 1.25 |"), "{md}");
        let svg = svg(&rows);
        assert!(
            svg.starts_with("<svg")
                && svg.contains("bare relay (Rust)")
                && svg.trim_end().ends_with("</svg>")
        );
    }
}
