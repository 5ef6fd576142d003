//! The benchmarks: idle capacity, relay throughput and latency, session setup and the
//! registration storm. Each starts its workers, reads the figures and adds rows.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use super::measure::{
    clock_ticks, cpu_percent, median, proc_stats, rss_per_connection_kib, shares,
};
use super::process::{spec, Profiler, Running, Worker};
use super::{row, Options, Profile, Row};
use crate::target::TargetInfo;
use crate::worker::{deserialize, new_histogram, summarize, Latency, Scenario};

pub async fn capacity(
    opts: &Options,
    running: &Running,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let pid = running.child.id().context("pid")?;
    let robots = opts.profile.capacity_robots;
    capacity_over(
        opts,
        &running.info.name,
        std::slice::from_ref(&running.info),
        &[pid],
        robots,
        rows,
    )
    .await
}

/// Idle capacity with the workers spread round-robin over `targets` (one per node of a
/// cluster; worker w connects to `targets[w % n]`), memory and CPU summed over `pids`.
pub async fn capacity_over(
    opts: &Options,
    name: &str,
    targets: &[TargetInfo],
    pids: &[u32],
    robots: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let p = &opts.profile;
    let stats = || summed_stats(pids);
    let (rss_before, _) = stats()?;
    let clients = robots / 2;
    let total = robots + clients;
    // Every target gets as many workers (a worker is a process: its own fd limit).
    let per_target = total
        .div_ceil(p.sockets_per_worker)
        .div_ceil(targets.len().max(1));
    let workers_needed = per_target * targets.len().max(1);
    let started = Instant::now();
    let mut workers = Vec::new();
    for (w, scenario) in capacity_shares(robots, clients, workers_needed)
        .into_iter()
        .enumerate()
    {
        let target = &targets[w % targets.len()];
        workers.push(Worker::spawn(opts, &spec(target, scenario, &format!("cap{w}-"))).await?);
    }
    let mut sockets = 0;
    for worker in &mut workers {
        sockets += worker.event("ready").await?["sockets"]
            .as_u64()
            .unwrap_or(0);
    }
    let connect_secs = started.elapsed().as_secs_f64();
    // Let the target settle before reading memory, then watch idle CPU.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss_after, ticks_before) = stats()?;
    tokio::time::sleep(Duration::from_secs_f64(p.idle_secs)).await;
    let (_, ticks_after) = stats()?;
    for worker in workers {
        worker.finish().await?;
    }
    let per_conn_kib = rss_per_connection_kib(rss_before, rss_after, sockets);
    let cpu = cpu_percent(ticks_before, ticks_after, clock_ticks(), p.idle_secs);
    let figures = [
        ("idle sockets", sockets as f64, "sockets"),
        ("RSS per idle connection", per_conn_kib, "KiB"),
        ("RSS total", rss_after as f64 / 1024.0, "MiB"),
        ("CPU while idle", cpu, "% of a core"),
        ("time to connect all", connect_secs, "s"),
    ];
    for (metric, value, unit) in figures {
        rows.push(row("capacity", name, metric, value, unit));
    }
    Ok(())
}

/// RSS and CPU ticks summed over `pids`.
fn summed_stats(pids: &[u32]) -> anyhow::Result<(u64, u64)> {
    let mut sum = (0, 0);
    for pid in pids {
        let (rss, ticks) = proc_stats(*pid)?;
        sum = (sum.0 + rss, sum.1 + ticks);
    }
    Ok(sum)
}

/// Each worker's part of the idle sockets: consecutive robot numbers, clients alongside.
fn capacity_shares(robots: usize, clients: usize, workers: usize) -> Vec<Scenario> {
    let mut first = 0;
    shares(robots, workers)
        .into_iter()
        .zip(shares(clients, workers))
        .map(|(robots, clients)| {
            let scenario = Scenario::Capacity {
                first,
                robots,
                clients,
            };
            first += robots;
            scenario
        })
        .collect()
}

/// With BENCH_PERF_OUT set, the relay runs are profiled (see process::Profiler).
pub async fn relay(opts: &Options, running: &Running, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let profiler = Profiler::start(running, "relay");
    let result = relay_runs(opts, running, rows).await;
    profiler.stop().await;
    result
}

async fn relay_runs(opts: &Options, running: &Running, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let p = &opts.profile;
    let name = &running.info.name;
    for RelayRun {
        label,
        size,
        b_to_a,
        rate,
        repeats,
        sessions,
    } in relay_plan(p)
    {
        // BENCH_RELAY_ONLY=text: only the runs whose label contains it (focused A/B runs).
        if std::env::var("BENCH_RELAY_ONLY").is_ok_and(|only| !label.contains(&only)) {
            continue;
        }
        let mut throughputs = Vec::new();
        let mut p99s = Vec::new();
        let mut cpu_per_message = Vec::new();
        let mut merged = new_histogram();
        for r in 0..repeats {
            let scenario = Scenario::Relay {
                sessions,
                size,
                b_to_a,
                rate,
                window: p.window,
                secs: p.relay_secs,
            };
            let (result, latency, ticks) =
                run_measured(opts, running, scenario, &format!("rel{r}{size}-")).await?;
            let received = result["received"].as_u64().unwrap_or(0).max(1);
            cpu_per_message.push(ticks as f64 / clock_ticks() / received as f64 * 1e6);
            let refused = result["refused"].as_u64().unwrap_or(0);
            if refused > 0 {
                eprintln!("[bench] {name}, {label}: {refused} messages refused (throttled)");
            }
            throughputs.push(result["throughput"].as_f64().unwrap_or(0.0));
            p99s.push(latency.p99_us);
            merged.add(deserialize(&latency)?)?;
        }
        let latency = summarize(&merged);
        let mut t = row(&label, name, "throughput", median(&throughputs), "msgs/s");
        t.runs = throughputs;
        rows.push(t);
        let mut l = row(&label, name, "p99 latency", median(&p99s), "µs");
        l.runs = p99s;
        l.latency = Some((&latency).into());
        rows.push(l);
        // CPU time of the relay's process (every thread, user and system) over the runs'
        // messages: what each message costs the relay, whose cores the generator shares.
        let mut c = row(
            &label,
            name,
            "CPU per message",
            median(&cpu_per_message),
            "µs",
        );
        c.runs = cpu_per_message;
        rows.push(c);
    }
    Ok(())
}

/// One relay run: message size, direction (robot → client), offered rate (None: as fast
/// as the window allows), repeats, and how many sessions share the load.
#[derive(Debug, Clone, PartialEq)]
struct RelayRun {
    label: String,
    size: usize,
    b_to_a: bool,
    rate: Option<u64>,
    repeats: usize,
    sessions: usize,
}

fn relay_plan(p: &Profile) -> Vec<RelayRun> {
    let run = |label: String, size, b_to_a, rate, repeats, sessions| RelayRun {
        label,
        size,
        b_to_a,
        rate,
        repeats,
        sessions,
    };
    let many = p.relay_sessions;
    let few = p.relay_few_sessions;
    vec![
        run("relay 250 B, saturated".into(), 250, false, None, 1, many),
        run(
            "relay 250 B, fixed load".into(),
            250,
            false,
            Some(p.offered_rate),
            p.latency_repeats,
            many,
        ),
        // The same offered load over few pairs: each socket carries many more messages a
        // second, so what one socket's path costs per message (and its hand-offs) shows in
        // the tail instead of being spread over 1,000 sockets.
        run(
            format!("relay 250 B, fixed load, {few} pairs"),
            250,
            false,
            Some(p.offered_rate),
            p.latency_repeats,
            few,
        ),
        run("relay 6 KB, saturated".into(), 6_000, true, None, 1, many),
        // The same load over few sessions: per-socket costs weigh more, batching less.
        run(
            format!("relay 250 B, saturated, {few} sessions"),
            250,
            false,
            None,
            1,
            few,
        ),
        run(
            format!("relay 6 KB, saturated, {few} sessions"),
            6_000,
            true,
            None,
            1,
            few,
        ),
    ]
}

/// `run_worker`, also reading the target's CPU ticks between go and result.
async fn run_measured(
    opts: &Options,
    running: &Running,
    scenario: Scenario,
    tag: &str,
) -> anyhow::Result<(Value, Latency, u64)> {
    let pid = running.child.id().context("pid")?;
    let mut worker = Worker::spawn(opts, &spec(&running.info, scenario, tag)).await?;
    worker.event("ready").await?;
    let (_, before) = proc_stats(pid)?;
    worker.say("go").await?;
    let result = worker.event("result").await?;
    let (_, after) = proc_stats(pid)?;
    worker.finish().await?;
    let latency: Latency = serde_json::from_value(result["latency"].clone())?;
    Ok((result, latency, after.saturating_sub(before)))
}

/// One worker through ready → go → result; returns the result event and its latency.
async fn run_worker(
    opts: &Options,
    running: &Running,
    scenario: Scenario,
    tag: &str,
) -> anyhow::Result<(Value, Latency)> {
    let mut worker = Worker::spawn(opts, &spec(&running.info, scenario, tag)).await?;
    worker.event("ready").await?;
    worker.say("go").await?;
    let result = worker.event("result").await?;
    worker.finish().await?;
    let latency: Latency = serde_json::from_value(result["latency"].clone())?;
    Ok((result, latency))
}

pub async fn setup(opts: &Options, running: &Running, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let p = &opts.profile;
    let scenario = Scenario::Setup {
        sessions: p.setup_sessions,
        sdp_size: 2_000,
        secs: p.setup_secs,
    };
    let (result, latency) = run_worker(opts, running, scenario, "setup").await?;
    rows.push(rate_row(
        "session setup (offer → answer)",
        running,
        "rate",
        "offers/s",
        &result,
        &latency,
    ));
    Ok(())
}

pub async fn storm(
    opts: &Options,
    running: &Running,
    p256: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let p = &opts.profile;
    let scenario = Scenario::Storm {
        first: 0,
        robots: p.storm_robots,
        p256,
        concurrency: p.storm_concurrency,
    };
    let (result, latency) = run_worker(opts, running, scenario, "storm").await?;
    let label = if p256 {
        "registration storm, ECDSA P-256"
    } else {
        "registration storm, Ed25519"
    };
    rows.push(rate_row(
        label,
        running,
        "verified registrations",
        "per s",
        &result,
        &latency,
    ));
    Ok(())
}

/// A worker's `per_sec` figure with its latency distribution.
fn rate_row(
    benchmark: &str,
    running: &Running,
    metric: &str,
    unit: &str,
    result: &Value,
    latency: &Latency,
) -> Row {
    let mut r = row(
        benchmark,
        &running.info.name,
        metric,
        result["per_sec"].as_f64().unwrap_or(0.0),
        unit,
    );
    r.latency = Some(latency.into());
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::{FULL, SMOKE};

    #[test]
    fn capacity_workers_take_consecutive_robots_and_all_clients() {
        let parts = capacity_shares(12_000, 6_000, 3);
        let mut next_robot = 0;
        let mut clients_total = 0;
        for part in &parts {
            let Scenario::Capacity {
                first,
                robots,
                clients,
            } = part
            else {
                panic!("not a capacity scenario: {part:?}");
            };
            assert_eq!(*first, next_robot, "robot numbers follow on");
            assert_eq!((*robots, *clients), (4_000, 2_000));
            next_robot += robots;
            clients_total += clients;
        }
        assert_eq!((next_robot, clients_total), (12_000, 6_000));
        let uneven: Vec<_> = capacity_shares(5, 2, 2)
            .into_iter()
            .map(|s| match s {
                Scenario::Capacity {
                    first,
                    robots,
                    clients,
                } => (first, robots, clients),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(uneven, vec![(0, 3, 1), (3, 2, 1)]);
    }

    #[test]
    fn the_relay_plan_repeats_only_the_fixed_load_runs() {
        for profile in [FULL, SMOKE] {
            let plan = relay_plan(&profile);
            let few = profile.relay_few_sessions;
            let labels: Vec<&str> = plan.iter().map(|run| run.label.as_str()).collect();
            assert_eq!(
                labels,
                [
                    "relay 250 B, saturated".to_string(),
                    "relay 250 B, fixed load".to_string(),
                    format!("relay 250 B, fixed load, {few} pairs"),
                    "relay 6 KB, saturated".to_string(),
                    format!("relay 250 B, saturated, {few} sessions"),
                    format!("relay 6 KB, saturated, {few} sessions"),
                ]
            );
            for run in &plan {
                let fixed = run.label.contains("fixed load");
                assert_eq!(run.rate.is_some(), fixed);
                assert_eq!(run.repeats, if fixed { profile.latency_repeats } else { 1 });
                assert_eq!(run.b_to_a, run.size == 6_000);
            }
            assert_eq!(plan[0].sessions, profile.relay_sessions);
            assert_eq!(plan[5].sessions, few);
            // Both fixed-load runs offer the same total rate, over many sessions and few.
            assert_eq!(plan[1].rate, Some(profile.offered_rate));
            assert_eq!(plan[1].sessions, profile.relay_sessions);
            assert_eq!(plan[2].rate, Some(profile.offered_rate));
            assert_eq!(plan[2].sessions, few);
            assert_eq!(plan[2].size, 250);
        }
    }
}
