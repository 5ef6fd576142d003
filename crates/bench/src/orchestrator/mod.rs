//! Runs every benchmark against every target and collects the figures.
//!
//! `process` starts and stops what is measured (our server, peer relays, load-generator
//! workers), `measure` turns raw readings into figures (pure, unit-tested), `scenarios`
//! runs capacity, relay, setup and storm and writes their rows.

mod cluster;
mod fleet_ca;
pub mod instructions;
mod measure;
pub mod memory;
mod process;
mod scenarios;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::worker::Latency;

pub use cluster::cluster;
pub use measure::describe_machine;
pub use process::{peer_available, start_ours, start_peer, Keys, Running};
pub use scenarios::{capacity, relay, setup, storm};

/// Sizes of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    pub name: &'static str,
    /// Robots held idle; clients are half as many.
    pub capacity_robots: usize,
    pub sockets_per_worker: usize,
    pub idle_secs: f64,
    pub relay_sessions: usize,
    /// The relay runs again over this few sessions.
    pub relay_few_sessions: usize,
    pub relay_secs: f64,
    /// Messages per second offered in all by the fixed-load runs (over `relay_sessions`
    /// and over `relay_few_sessions` pairs).
    pub offered_rate: u64,
    pub latency_repeats: usize,
    pub window: usize,
    pub storm_robots: usize,
    pub storm_concurrency: usize,
    pub setup_sessions: usize,
    pub setup_secs: f64,
}

pub const FULL: Profile = Profile {
    name: "full",
    capacity_robots: 12_000,
    sockets_per_worker: 6_000,
    idle_secs: 10.0,
    relay_sessions: 1_000,
    relay_few_sessions: 50,
    relay_secs: 10.0,
    offered_rate: 20_000,
    latency_repeats: 3,
    window: 8,
    storm_robots: 3_000,
    storm_concurrency: 1_000,
    setup_sessions: 200,
    setup_secs: 10.0,
};

pub const SMOKE: Profile = Profile {
    name: "smoke",
    capacity_robots: 200,
    sockets_per_worker: 200,
    idle_secs: 1.0,
    relay_sessions: 20,
    // 2,000 msgs/s over 5 pairs: the same 400 msgs/s per pair as the full profile's
    // fixed load over 50 pairs.
    relay_few_sessions: 5,
    relay_secs: 1.0,
    offered_rate: 2_000,
    latency_repeats: 1,
    window: 4,
    storm_robots: 100,
    storm_concurrency: 100,
    setup_sessions: 10,
    setup_secs: 1.0,
};

pub struct Options {
    pub profile: Profile,
    pub out: PathBuf,
    pub server_bin: PathBuf,
    pub bench_bin: PathBuf,
    pub bare_bin: PathBuf,
    pub peers: Vec<String>,
    pub postgres_url: Option<String>,
    pub repo: PathBuf,
    pub only: Vec<String>,
    /// The server under test on [`SERVER_CPU`], load generators on [`GENERATOR_CPU`].
    pub pin: bool,
}

/// Where `--pin` puts the server under test and the load generators.
pub const SERVER_CPU: usize = 1;
pub const GENERATOR_CPU: usize = 0;

impl Options {
    /// The CPU the server under test is confined to, if any.
    pub fn server_cpu(&self) -> Option<usize> {
        self.pin.then_some(SERVER_CPU)
    }

    /// The CPU the load generators are confined to, if any.
    pub fn generator_cpu(&self) -> Option<usize> {
        self.pin.then_some(GENERATOR_CPU)
    }
}

/// One measured figure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub benchmark: String,
    pub target: String,
    pub metric: String,
    pub value: f64,
    pub unit: String,
    /// Other runs of the same figure, for the spread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyFigures>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyFigures {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub count: u64,
}

impl From<&Latency> for LatencyFigures {
    fn from(l: &Latency) -> Self {
        LatencyFigures {
            p50_us: l.p50_us,
            p99_us: l.p99_us,
            p999_us: l.p999_us,
            max_us: l.max_us,
            count: l.count,
        }
    }
}

fn row(benchmark: &str, target: &str, metric: &str, value: f64, unit: &str) -> Row {
    Row {
        benchmark: benchmark.into(),
        target: target.into(),
        metric: metric.into(),
        value,
        unit: unit.into(),
        runs: Vec::new(),
        latency: None,
    }
}
