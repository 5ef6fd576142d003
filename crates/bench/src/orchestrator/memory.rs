//! `signalling-bench memory`: what one more idle verified robot costs our server in memory
//! (issue 44). A two-point difference (RSS with N robots minus RSS with none) moved from
//! 4.6 to 7.6 KiB between runs of one check: it mixes the first robot's fixed costs (tables,
//! buffers, the allocator's first pages) with the marginal one and rests on two samples.
//! Here robots are added in equal steps (1,000 by default) on a fresh server, its RSS read at
//! each plateau once it has gone quiet, and a least-squares line fitted through the plateaus:
//! its slope is the marginal memory per robot, given with its standard error. Several rounds,
//! each on a new server, show how far the figure moves between runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::measure::proc_stats;
use super::process::{spec, start_ours, Keys, Worker};
use super::{Options, FULL};
use crate::worker::Scenario;

#[derive(clap::Args)]
pub struct MemoryArgs {
    /// Robots added at each plateau.
    #[arg(long, default_value_t = 1_000)]
    step: usize,
    /// Plateaus per round (at least 3: the fit needs a spread).
    #[arg(long, default_value_t = 4)]
    plateaus: usize,
    /// Rounds, each on a fresh server.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Folder with the release binaries.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
}

/// A server is quiet when it used no CPU tick over this long.
const QUIET: Duration = Duration::from_millis(500);
/// The longest wait for quiet before reading anyway.
const QUIET_BOUND: Duration = Duration::from_secs(30);

pub async fn run(args: MemoryArgs) -> anyhow::Result<()> {
    if args.plateaus < 3 || args.step == 0 {
        bail!("--plateaus must be at least 3 and --step above 0");
    }
    let opts = Options {
        profile: FULL,
        out: PathBuf::new(),
        server_bin: args.bin_dir.join("signalling-server"),
        bench_bin: std::env::current_exe()?,
        bare_bin: args.bin_dir.join("bare-relay"),
        peers: Vec::new(),
        postgres_url: None,
        repo: std::env::current_dir()?,
        only: Vec::new(),
        pin: false,
    };
    let keys = Keys::new()?;
    let mut slopes = Vec::new();
    println!(
        "memory per idle verified robot: {} plateaus of {} robots, {} rounds (RSS in KiB)",
        args.plateaus, args.step, args.rounds
    );
    for round in 1..=args.rounds {
        let fit = one_round(&opts, &keys, &args).await?;
        println!(
            "round {round}: RSS {} → {} KiB; slope {:.2} ± {:.2} KiB per robot; \
             intercept {:.0} KiB; two-point (last − empty) ÷ robots {:.2}",
            fit.points.first().map_or(0, |p| p.1),
            fit.points.last().map_or(0, |p| p.1),
            fit.slope,
            fit.slope_se,
            fit.intercept,
            fit.two_point,
        );
        slopes.push(fit.slope);
    }
    slopes.sort_by(f64::total_cmp);
    println!(
        "slope per robot over the rounds: median {:.2} KiB, range {:.2}–{:.2}",
        slopes[slopes.len() / 2],
        slopes[0],
        slopes[slopes.len() - 1]
    );
    Ok(())
}

struct Fit {
    /// (robots, RSS KiB), the first at no robot.
    points: Vec<(usize, u64)>,
    slope: f64,
    slope_se: f64,
    intercept: f64,
    two_point: f64,
}

/// A fresh server; robots added step by step, each step's RSS read when the server is quiet.
async fn one_round(opts: &Options, keys: &Keys, args: &MemoryArgs) -> anyhow::Result<Fit> {
    let robots = args.step * args.plateaus;
    let server = start_ours(opts, keys, None, robots, 0).await?;
    let pid = server.child.id().context("server pid")?;
    let mut points = vec![(0, quiet_rss(pid).await?)];
    let mut workers = Vec::new();
    for k in 0..args.plateaus {
        let scenario = Scenario::Capacity {
            first: k * args.step,
            robots: args.step,
            clients: 0,
        };
        let mut worker =
            Worker::spawn(opts, &spec(&server.info, scenario, &format!("mem{k}-"))).await?;
        let sockets = worker.event("ready").await?["sockets"]
            .as_u64()
            .unwrap_or(0);
        if sockets != args.step as u64 {
            bail!("plateau {k}: {sockets} robots connected of {}", args.step);
        }
        workers.push(worker);
        points.push(((k + 1) * args.step, quiet_rss(pid).await?));
    }
    for worker in workers {
        worker.finish().await?;
    }
    server.stop().await;
    let plateaus: Vec<(f64, f64)> = points[1..]
        .iter()
        .map(|&(n, rss)| (n as f64, rss as f64))
        .collect();
    let (slope, slope_se, intercept) = least_squares(&plateaus);
    let two_point = (points[points.len() - 1].1 as f64 - points[0].1 as f64) / robots as f64;
    Ok(Fit {
        points,
        slope,
        slope_se,
        intercept,
        two_point,
    })
}

/// The server's RSS (KiB) once it has used no CPU for [`QUIET`] (or after [`QUIET_BOUND`]).
async fn quiet_rss(pid: u32) -> anyhow::Result<u64> {
    let deadline = Instant::now() + QUIET_BOUND;
    let (_, mut ticks) = proc_stats(pid)?;
    loop {
        tokio::time::sleep(QUIET).await;
        let (rss, now) = proc_stats(pid)?;
        if now == ticks || Instant::now() > deadline {
            return Ok(rss);
        }
        ticks = now;
    }
}

/// Slope, its standard error and intercept of the least-squares line through `points`.
fn least_squares(points: &[(f64, f64)]) -> (f64, f64, f64) {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let slope = sxy / sxx;
    let intercept = mean_y - slope * mean_x;
    let residuals: f64 = points
        .iter()
        .map(|p| (p.1 - intercept - slope * p.0).powi(2))
        .sum();
    let slope_se = if points.len() > 2 {
        (residuals / (n - 2.0) / sxx).sqrt()
    } else {
        f64::NAN
    };
    (slope, slope_se, intercept)
}

#[cfg(test)]
mod tests {
    use super::least_squares;

    #[test]
    fn a_straight_line_has_its_slope_and_no_error() {
        let points: Vec<(f64, f64)> = (1..=4)
            .map(|k| (k as f64 * 1000.0, 30_000.0 + 4.0 * k as f64 * 1000.0))
            .collect();
        let (slope, se, intercept) = least_squares(&points);
        assert!(
            (slope - 4.0).abs() < 1e-9 && se.abs() < 1e-9 && (intercept - 30_000.0).abs() < 1e-6
        );
    }

    #[test]
    fn scatter_gives_a_standard_error() {
        // y = 2x with residuals +1, −1, −1, +1 around it at x = 1..4: slope 2, and
        // SE = sqrt((4 / 2) / 5).
        let points = [(1.0, 3.0), (2.0, 3.0), (3.0, 5.0), (4.0, 9.0)];
        let (slope, se, _) = least_squares(&points);
        assert!((slope - 2.0).abs() < 1e-9, "{slope}");
        assert!((se - (2.0f64 / 5.0).sqrt()).abs() < 1e-9, "{se}");
    }
}
