//! signalling-bench: measures our signalling server against peer relays on this machine.
//!
//! `signalling-bench run --out DIR [--smoke]` runs everything (see docs/benchmarks.md);
//! `signalling-bench worker SPEC` is a load-generator process the runner starts itself.

mod chaos;
mod orchestrator;
mod report;
mod target;
mod worker;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::json;

use orchestrator::{Options, Row, FULL, SMOKE};

#[derive(Parser)]
#[command(
    name = "signalling-bench",
    about = "Benchmark harness for the signalling server"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every benchmark and write results.json, results.md and results.svg into --out.
    Run {
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        /// Small sizes and short runs: seconds, for CI.
        #[arg(long)]
        smoke: bool,
        /// Peers to compare with (those not installed are skipped with a note).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "bare,node,python,matchbox"
        )]
        peers: Vec<String>,
        /// Also run the registration storm against PostgreSQL.
        #[arg(long, env = "BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        /// Folder with the release binaries.
        #[arg(long, default_value = "target/release")]
        bin_dir: PathBuf,
        /// Benchmarks to run: capacity, relay, setup, storm.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "capacity,relay,setup,storm"
        )]
        only: Vec<String>,
        /// Separate cores: the server under test (ours and each peer) on CPU 1, the load
        /// generators on CPU 0 (`taskset`). Without it all share both cores, and a tail
        /// measures the scheduler as much as the server.
        #[arg(long)]
        pin: bool,
        #[command(flatten)]
        sizes: Sizes,
    },
    /// Only the cluster benchmark (three nodes on Redis and PostgreSQL): relay same node
    /// vs cross-node, and the capacity of the three nodes. Writes results.* into --out.
    Cluster {
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        #[arg(long)]
        smoke: bool,
        #[arg(long, env = "BENCH_POSTGRES_URL")]
        postgres_url: String,
        #[arg(long, default_value = "target/release")]
        bin_dir: PathBuf,
        /// capacity, relay.
        #[arg(long, value_delimiter = ',', default_value = "capacity,relay")]
        only: Vec<String>,
        #[command(flatten)]
        sizes: Sizes,
    },
    /// The chaos and soak load (issue 42): robots, people and programs behind one URL,
    /// with books. Controlled on stdin (`mark NAME`, `stop`); tests/chaos/run.sh and
    /// bench/soak.sh start it.
    Chaos(chaos::ChaosArgs),
    /// What each operation costs the server (issue 44): marginal instructions per
    /// operation under callgrind (the regression guard: --check) and CPU µs per operation
    /// in a plain run. Relay, session setup, robot logins (Ed25519, P-256), ARP tool calls.
    Instructions(orchestrator::instructions::InstructionsArgs),
    /// Memory per idle verified robot (issue 44): the server's RSS at plateaus of robots
    /// (1k, 2k, 3k, 4k by default), the least-squares slope with its standard error, a
    /// fresh server per round.
    Memory(orchestrator::memory::MemoryArgs),
    /// Internal: one load-generator process.
    Worker { spec: String },
}

/// Overrides of the profile's relay sizes, for shorter runs while iterating or longer
/// ones for steadier figures.
#[derive(clap::Args)]
struct Sizes {
    /// Overrides the profile's seconds per relay run (longer runs: steadier figures).
    #[arg(long)]
    relay_secs: Option<f64>,
    /// Overrides the profile's offered rate of the fixed-load relay runs (msgs/s in all).
    #[arg(long)]
    offered_rate: Option<u64>,
    /// Overrides how often the fixed-load relay runs are repeated.
    #[arg(long)]
    latency_repeats: Option<usize>,
}

impl Sizes {
    fn profile(&self, smoke: bool) -> orchestrator::Profile {
        let mut profile = if smoke { SMOKE } else { FULL };
        profile.relay_secs = self.relay_secs.unwrap_or(profile.relay_secs);
        profile.offered_rate = self.offered_rate.unwrap_or(profile.offered_rate);
        profile.latency_repeats = self.latency_repeats.unwrap_or(profile.latency_repeats);
        profile
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Worker { spec } => {
            worker::run(serde_json::from_str(&spec).context("worker spec")?).await
        }
        Cmd::Chaos(args) => chaos::run(args).await,
        Cmd::Instructions(args) => orchestrator::instructions::run(args).await,
        Cmd::Memory(args) => orchestrator::memory::run(args).await,
        Cmd::Run {
            out,
            smoke,
            peers,
            postgres_url,
            bin_dir,
            only,
            pin,
            sizes,
        } => {
            let repo = std::env::current_dir()?;
            let opts = Options {
                profile: sizes.profile(smoke),
                out,
                server_bin: bin_dir.join("signalling-server"),
                bench_bin: std::env::current_exe()?,
                bare_bin: bin_dir.join("bare-relay"),
                peers,
                postgres_url,
                repo,
                only,
                pin,
            };
            run(opts).await
        }
        Cmd::Cluster {
            out,
            smoke,
            postgres_url,
            bin_dir,
            only,
            sizes,
        } => {
            let opts = Options {
                profile: sizes.profile(smoke),
                out,
                server_bin: bin_dir.join("signalling-server"),
                bench_bin: std::env::current_exe()?,
                bare_bin: bin_dir.join("bare-relay"),
                peers: Vec::new(),
                postgres_url: Some(postgres_url.clone()),
                repo: std::env::current_dir()?,
                only,
                pin: false,
            };
            let started = std::time::Instant::now();
            let keys = orchestrator::Keys::new()?;
            let mut rows: Vec<Row> = Vec::new();
            eprintln!("[bench] cluster of 3 nodes");
            orchestrator::cluster(&opts, &keys, &postgres_url, &mut rows).await?;
            let mut conditions = orchestrator::describe_machine(&opts.repo);
            conditions["duration_secs"] = json!(started.elapsed().as_secs_f64().round());
            let profile = serde_json::to_value(&opts.profile)?;
            report::write_all(&opts.out, &rows, &conditions, &profile)?;
            print!("{}", report::markdown(&rows, &conditions));
            Ok(())
        }
    }
}

/// Whether `--only` asks for the benchmark `name`.
fn wants(opts: &Options, name: &str) -> bool {
    opts.only.iter().any(|o| o == name)
}

/// The benchmarks every target runs: capacity, relay and session setup.
async fn run_suite(
    opts: &Options,
    target: &orchestrator::Running,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let wants = |name: &str| wants(opts, name);
    let name = &target.info.name;
    if wants("capacity") {
        eprintln!("[bench] {name}: capacity");
        orchestrator::capacity(opts, target, rows).await?;
    }
    if wants("relay") {
        eprintln!("[bench] {name}: relay");
        orchestrator::relay(opts, target, rows).await?;
    }
    if wants("setup") {
        eprintln!("[bench] {name}: session setup");
        orchestrator::setup(opts, target, rows).await?;
    }
    Ok(())
}

async fn run(opts: Options) -> anyhow::Result<()> {
    let keys = orchestrator::Keys::new()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut notes = Vec::new();
    let p = &opts.profile;
    let started = std::time::Instant::now();

    eprintln!(
        "[bench] ours (SQLite): preparing {} robots",
        p.capacity_robots
    );
    let ours =
        orchestrator::start_ours(&opts, &keys, None, p.capacity_robots, p.storm_robots).await?;
    run_suite(&opts, &ours, &mut rows).await?;
    if wants(&opts, "storm") {
        eprintln!("[bench] ours: registration storms");
        orchestrator::storm(&opts, &ours, false, &mut rows).await?;
        orchestrator::storm(&opts, &ours, true, &mut rows).await?;
    }
    ours.stop().await;

    match (&opts.postgres_url, wants(&opts, "storm")) {
        (Some(url), true) => {
            eprintln!("[bench] ours (PostgreSQL): registration storms");
            let pg = orchestrator::start_ours(&opts, &keys, Some(url), 1, p.storm_robots).await?;
            orchestrator::storm(&opts, &pg, false, &mut rows).await?;
            orchestrator::storm(&opts, &pg, true, &mut rows).await?;
            pg.stop().await;
        }
        (None, true) => {
            notes.push("registration storm on PostgreSQL skipped: no --postgres-url".to_string())
        }
        (_, false) => {}
    }

    // Several nodes: opt-in (it needs PostgreSQL and redis-server), `BENCH_CLUSTER=1`.
    if std::env::var("BENCH_CLUSTER").is_ok_and(|v| v == "1") {
        match &opts.postgres_url {
            Some(url) => {
                eprintln!("[bench] cluster of 3 nodes: relay same node vs cross-node");
                orchestrator::cluster(&opts, &keys, url, &mut rows).await?;
            }
            None => notes.push("cluster benchmark skipped: no --postgres-url".to_string()),
        }
    }

    for peer in &opts.peers {
        if !orchestrator::peer_available(&opts, peer) {
            let note = format!("peer {peer} skipped: not installed (bench/run.sh installs it)");
            eprintln!("[bench] {note}");
            notes.push(note);
            continue;
        }
        let running = orchestrator::start_peer(&opts, peer).await?;
        run_suite(&opts, &running, &mut rows).await?;
        running.stop().await;
    }

    let mut conditions = orchestrator::describe_machine(&opts.repo);
    conditions["pinned"] = json!(opts.pin.then(|| json!({
        "server_cpu": orchestrator::SERVER_CPU,
        "generator_cpu": orchestrator::GENERATOR_CPU,
    })));
    conditions["notes"] = json!(notes);
    conditions["duration_secs"] = json!(started.elapsed().as_secs_f64().round());
    let profile = serde_json::to_value(&opts.profile)?;
    report::write_all(&opts.out, &rows, &conditions, &profile)?;
    print!("{}", report::markdown(&rows, &conditions));
    eprintln!(
        "[bench] wrote {}/results.{{json,md,svg}}",
        opts.out.display()
    );
    Ok(())
}
