//! `signalling-bench instructions`: what one operation costs our server, counted two ways
//! (issue 44):
//!
//! - instructions, with the server under `valgrind --tool=callgrind`: they do not depend on
//!   what else runs on the machine, so they are CI's regression guard (`--check`);
//! - CPU time of the server's threads (utime + stime from /proc/PID/stat), in a separate
//!   plain run.
//!
//! Each operation runs as a small and a large fixed workload against one server, and its
//! figure is the marginal cost (large − small) / (n_large − n_small): what a workload costs
//! once (its sockets, logins, sessions) cancels, and so does the server's start. Callgrind's
//! counters are zeroed before and dumped after each workload (`callgrind_control`), once the
//! server has gone quiet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::process::Command;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;

use super::fleet_ca::FleetChains;
use super::measure::{clock_ticks, cpu_split, proc_stats};
use super::process::{
    admin, enroll_robot, free_port, ours_command, wait_listening, Keys, Launch, Running, TempDir,
};
use crate::target::{self, Dir, Reads, Route, Signer, Socket, TargetInfo};

/// The subject of every client and program of the workloads (an operator of their robots:
/// a session takes the control lock).
const SUBJECT: &str = "ins";
/// Robots the logins take turns with (a robot's new login replaces its old socket; by its
/// turn again the old one is long closed).
const LOGIN_POOL: usize = 32;
/// Logins at once.
const LOGIN_CONCURRENCY: usize = 4;
/// The robots of the X.509 logins.
const X509_PREFIX: &str = "ins-x509";
/// Relayed messages in flight in the relay workload.
const RELAY_WINDOW: usize = 32;
/// Size of a relayed ICE candidate.
const RELAY_SIZE: usize = 250;
/// Size of the SDP of an offer and of its answer.
const SDP_SIZE: usize = 2_000;
/// Tool calls in flight per program in the plain run (under callgrind: one, see
/// [`Op::arp_window`]).
const ARP_WINDOW: usize = 2;
/// A program sends a call at most this often: 40/s, under the gateway's 50/s.
const ARP_PACE: Duration = Duration::from_millis(25);
/// Stand-in robots (and programs) prepared for the ARP workload.
const ARP_ROBOTS: usize = 32;
/// The bound on a wait for the server; callgrind makes it some 50 times slower.
const WAIT: Duration = Duration::from_secs(120);

#[derive(clap::Args)]
pub struct InstructionsArgs {
    /// Operations to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "relay,setup,login,login-p256,login-x509,login-x509-kept,arp"
    )]
    only: Vec<String>,
    /// A baseline (`--write-baseline`'s file): fails when an operation takes more
    /// instructions than it says by over `--tolerance`.
    #[arg(long)]
    check: Option<PathBuf>,
    #[arg(long, default_value_t = 0.10)]
    tolerance: f64,
    /// Writes the figures measured as a baseline.
    #[arg(long)]
    write_baseline: Option<PathBuf>,
    /// Folder with the release binaries.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Instructions only, without the plain run (CPU time).
    #[arg(long)]
    no_cpu: bool,
    /// CPU time only, without callgrind.
    #[arg(long)]
    no_instructions: bool,
    /// Keeps each workload's callgrind profile in this folder (`OP-large.callgrind`, ...),
    /// for `callgrind_annotate`.
    #[arg(long)]
    profiles: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Relay,
    Setup,
    Login,
    LoginP256,
    LoginX509,
    LoginX509Kept,
    Arp,
}

const OPS: [Op; 7] = [
    Op::Relay,
    Op::Setup,
    Op::Login,
    Op::LoginP256,
    Op::LoginX509,
    Op::LoginX509Kept,
    Op::Arp,
];

/// Which run: the sizes differ (callgrind is some 50 times slower).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Callgrind,
    Plain,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Relay => "relay",
            Op::Setup => "setup",
            Op::Login => "login",
            Op::LoginP256 => "login-p256",
            Op::LoginX509 => "login-x509",
            Op::LoginX509Kept => "login-x509-kept",
            Op::Arp => "arp",
        }
    }

    fn parse(name: &str) -> anyhow::Result<Op> {
        OPS.into_iter()
            .find(|op| op.name() == name)
            .with_context(|| {
                format!(
                    "unknown operation {name} (relay, setup, login, login-p256, login-x509, \
                     login-x509-kept, arp)"
                )
            })
    }

    fn describe(self) -> &'static str {
        match self {
            Op::Relay => "relayed message (250 B ICE candidate, window 32)",
            Op::Setup => "session setup (offer → answer → hangup; grant, lock, record, ticket)",
            Op::Login => "verified robot login, Ed25519 (and its close)",
            Op::LoginP256 => "verified robot login, ECDSA P-256 (and its close)",
            Op::LoginX509 => {
                "verified robot login, X.509 chain presented and verified (a renewed P-256 leaf, \
                 intermediate, root; and its close)"
            }
            Op::LoginX509Kept => {
                "verified robot login, the enrolled X.509 chain presented again within a minute \
                 (its kept verification; and its close)"
            }
            Op::Arp => "ARP arp.callTool through the gateway, one call at a time (audit committed)",
        }
    }

    /// (small, large) workload in operations.
    fn sizes(self, mode: Mode) -> (usize, usize) {
        match (self, mode) {
            (Op::Relay, Mode::Callgrind) => (200, 2_200),
            (Op::Relay, Mode::Plain) => (2_000, 122_000),
            (Op::Setup, Mode::Callgrind) => (5, 65),
            (Op::Setup, Mode::Plain) => (50, 3_050),
            (Op::Login | Op::LoginP256 | Op::LoginX509 | Op::LoginX509Kept, Mode::Callgrind) => {
                (8, 48)
            }
            (Op::Login | Op::LoginP256 | Op::LoginX509 | Op::LoginX509Kept, Mode::Plain) => {
                (32, 3_032)
            }
            (Op::Arp, Mode::Callgrind) => (20, 260),
            (Op::Arp, Mode::Plain) => (320, 5_440),
        }
    }

    /// The unmeasured first run: what the server does on first use only. The kept chains'
    /// op logs the whole pool in, so that every measured login finds its verification kept.
    fn warm_up(self, mode: Mode) -> usize {
        match self {
            Op::LoginX509Kept => LOGIN_POOL,
            _ => self.sizes(mode).0,
        }
    }

    /// Programs (and stand-in robots) of the ARP workload.
    fn programs(mode: Mode) -> usize {
        match mode {
            Mode::Callgrind => 1,
            Mode::Plain => ARP_ROBOTS,
        }
    }

    /// Tool calls in flight per program. Under callgrind one program makes one call at a
    /// time, so the audit writer's batches do not depend on timing: each call's request is
    /// committed together with the previous call's outcome (which waits up to 50 ms for a
    /// record somebody waits for; the next request comes within the 25 ms pace). With
    /// several calls in flight, how many records shared a commit followed the machine's
    /// load, and the count moved by ±6 % between runs of one binary.
    fn arp_window(mode: Mode) -> usize {
        match mode {
            Mode::Callgrind => 1,
            Mode::Plain => ARP_WINDOW,
        }
    }
}

/// What one operation costs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Figures {
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions_per_op: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_us_per_op: Option<f64>,
    /// The part of `cpu_us_per_op` spent in the kernel (socket reads and writes, epoll,
    /// wake-ups, file writes), which callgrind's counts leave out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kernel_us_per_op: Option<f64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    describe: String,
}

/// The committed baseline (bench/instructions.json).
#[derive(Debug, Serialize, Deserialize)]
struct Baseline {
    about: String,
    ops: BTreeMap<String, Figures>,
}

pub async fn run(args: InstructionsArgs) -> anyhow::Result<()> {
    let ops = args
        .only
        .iter()
        .map(|name| Op::parse(name))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let server_bin = args.bin_dir.join("signalling-server");
    let keys = Keys::new()?;
    let mut figures: BTreeMap<Op, Figures> = ops
        .iter()
        .map(|op| {
            (
                *op,
                Figures {
                    describe: op.describe().into(),
                    ..Figures::default()
                },
            )
        })
        .collect();
    if !args.no_instructions {
        let started = Instant::now();
        let server = Server::start(&server_bin, &keys, &ops, Mode::Callgrind).await?;
        for op in &ops {
            let per_op = server.instructions(*op, args.profiles.as_deref()).await?;
            eprintln!("[instructions] {}: {per_op:.0} instructions/op", op.name());
            figures.entry(*op).or_default().instructions_per_op = Some(per_op);
        }
        server.running.stop().await;
        eprintln!(
            "[instructions] callgrind run: {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    if !args.no_cpu {
        let started = Instant::now();
        let server = Server::start(&server_bin, &keys, &ops, Mode::Plain).await?;
        for op in &ops {
            let (per_op, kernel) = server.cpu_us(*op).await?;
            eprintln!(
                "[instructions] {}: {per_op:.1} µs CPU/op ({kernel:.1} in the kernel)",
                op.name()
            );
            let figure = figures.entry(*op).or_default();
            figure.cpu_us_per_op = Some(per_op);
            figure.kernel_us_per_op = Some(kernel);
        }
        server.running.stop().await;
        eprintln!(
            "[instructions] plain run: {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    print!("{}", table(&figures));
    let by_name: BTreeMap<String, Figures> = figures
        .iter()
        .map(|(op, f)| (op.name().to_string(), f.clone()))
        .collect();
    if let Some(path) = &args.write_baseline {
        write_baseline(path, &by_name)?;
    }
    if let Some(path) = &args.check {
        check_baseline(path, &by_name, args.tolerance)?;
    }
    Ok(())
}

/// Writes the figures as the committed baseline.
fn write_baseline(
    path: &std::path::Path,
    by_name: &BTreeMap<String, Figures>,
) -> anyhow::Result<()> {
    let baseline = Baseline {
        about: "signalling-bench instructions --write-baseline: the server's marginal \
                instructions per operation under callgrind; CI (.ci/run, step bench) fails \
                when one is over 10 % above this"
            .into(),
        ops: by_name.clone(),
    };
    std::fs::write(path, serde_json::to_string_pretty(&baseline)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("[instructions] baseline written to {}", path.display());
    Ok(())
}

/// Fails when an operation's instructions are over `tolerance` above the baseline's.
fn check_baseline(
    path: &std::path::Path,
    by_name: &BTreeMap<String, Figures>,
    tolerance: f64,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let baseline: Baseline = serde_json::from_str(&text)?;
    let (report, regressed) = check(&baseline.ops, by_name, tolerance);
    print!("{report}");
    if regressed {
        bail!(
            "instructions per operation regressed by over {:.0} % against {}",
            tolerance * 100.0,
            path.display()
        );
    }
    Ok(())
}

/// The figures as a Markdown table, with the ops/s one core would sustain.
fn table(figures: &BTreeMap<Op, Figures>) -> String {
    let mut out = String::from(
        "\n| operation | instructions/op | server CPU µs/op | of which kernel | ops/s per core |\n|---|---:|---:|---:|---:|\n",
    );
    for (op, f) in figures {
        let instructions = f
            .instructions_per_op
            .map_or("–".to_string(), |i| format!("{i:.0}"));
        let (cpu, rate) = match f.cpu_us_per_op {
            Some(us) if us > 0.0 => (format!("{us:.1}"), format!("{:.0}", 1e6 / us)),
            _ => ("–".to_string(), "–".to_string()),
        };
        let kernel = f
            .kernel_us_per_op
            .map_or("–".to_string(), |k| format!("{k:.1}"));
        out.push_str(&format!(
            "| {} ({}) | {instructions} | {cpu} | {kernel} | {rate} |\n",
            op.name(),
            op.describe()
        ));
    }
    out
}

/// Each operation's instructions against the baseline's; true if any is over
/// `1 + tolerance` times its baseline.
fn check(
    baseline: &BTreeMap<String, Figures>,
    measured: &BTreeMap<String, Figures>,
    tolerance: f64,
) -> (String, bool) {
    let mut report = String::new();
    let mut regressed = false;
    for (name, figures) in measured {
        let Some(now) = figures.instructions_per_op else {
            continue;
        };
        let Some(before) = baseline.get(name).and_then(|b| b.instructions_per_op) else {
            report.push_str(&format!(
                "guard: {name}: {now:.0} instructions/op, no baseline\n"
            ));
            continue;
        };
        let ratio = now / before.max(1.0);
        let verdict = if ratio > 1.0 + tolerance {
            regressed = true;
            "REGRESSION"
        } else if ratio < 1.0 - tolerance {
            "cheaper: update the baseline"
        } else {
            "ok"
        };
        report.push_str(&format!(
            "guard: {name}: {now:.0} instructions/op, baseline {before:.0} ({:+.1} %) {verdict}\n",
            (ratio - 1.0) * 100.0
        ));
    }
    (report, regressed)
}

/// Our server with robots, grants and a client token prepared for the workloads.
struct Server {
    running: Running,
    pid: u32,
    info: TargetInfo,
    token: String,
    ed25519: Arc<Signer>,
    p256: Arc<Signer>,
    /// The X.509 robots' chains, when their logins are measured.
    fleet: Option<Arc<FleetChains>>,
    mode: Mode,
    /// Callgrind's output file (and the folder its dumps go to).
    callgrind_out: Option<PathBuf>,
}

impl Server {
    async fn start(bin: &Path, keys: &Keys, ops: &[Op], mode: Mode) -> anyhow::Result<Server> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("signalling-ins-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        let database = format!("sqlite://{}/bench.db", dir.display());
        let callgrind_out = (mode == Mode::Callgrind).then(|| dir.join("callgrind.out"));
        let launch = match &callgrind_out {
            Some(out) => Launch::Callgrind(out),
            None => Launch::Plain,
        };
        // X.509 logins: robots present chains to a root the server trusts, and are
        // registered at their first login (the first pass below, unmeasured).
        let fleet = if ops.contains(&Op::LoginX509) || ops.contains(&Op::LoginX509Kept) {
            let fleet = FleetChains::issue(X509_PREFIX, LOGIN_POOL, keys.p256_pkcs8())?;
            fleet.write_anchors(&dir.join("anchors.pem"))?;
            Some(Arc::new(fleet))
        } else {
            None
        };
        let mut command = ours_command(bin, port, &database, launch);
        if fleet.is_some() {
            command
                .arg("--trust-anchors")
                .arg(dir.join("anchors.pem"))
                .arg("--auto-register");
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {} ({mode:?})", bin.display()))?;
        wait_listening(port, &mut child).await?;
        let pid = child.id().context("pid")?;
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let token = admin(
            &http,
            reqwest::Method::POST,
            format!("{base}/v1/tokens"),
            json!({"subject": SUBJECT, "ttlSeconds": 86_400}),
        )
        .await?["token"]
            .as_str()
            .context("token")?
            .to_string();
        let info = keys.target_info("ours", &format!("ws://127.0.0.1:{port}/ws"), &token);
        let ed = keys.ed25519_public_base64();
        let mut robots: Vec<(String, String, bool)> = Vec::new();
        for op in ops {
            match op {
                Op::Relay => robots.push(("ins-relay".into(), ed.clone(), true)),
                Op::Setup => robots.push(("ins-setup".into(), ed.clone(), true)),
                Op::Login => robots
                    .extend((0..LOGIN_POOL).map(|i| (format!("ins-ed-{i}"), ed.clone(), false))),
                Op::LoginP256 => robots.extend((0..LOGIN_POOL).map(|i| {
                    (
                        format!("ins-p256-{i}"),
                        keys.p256_spki_pem().to_string(),
                        false,
                    )
                })),
                Op::Arp => robots
                    .extend((0..ARP_ROBOTS).map(|i| (format!("ins-arp-{i}"), ed.clone(), true))),
                // Registered by their certificates at their first login.
                Op::LoginX509 | Op::LoginX509Kept => {}
            }
        }
        let gate = Arc::new(Semaphore::new(8));
        let mut tasks = Vec::new();
        for (robot, key, grant) in robots {
            let (http, base, gate) = (http.clone(), base.clone(), gate.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await?;
                let grant = grant.then_some((SUBJECT, "operator"));
                enroll_robot(&http, &base, &robot, &key, grant).await
            }));
        }
        for task in tasks {
            task.await??;
        }
        let ed25519 = Arc::new(Signer::from_info(&info, false)?);
        let p256 = Arc::new(Signer::from_info(&info, true)?);
        if let Some(fleet) = &fleet {
            let enrolled = Some((fleet, Presented::Enrolled));
            logins(&info, &p256, X509_PREFIX, enrolled, LOGIN_POOL).await?;
        }
        Ok(Server {
            running: Running::ours(info.clone(), child, TempDir(dir)),
            pid,
            info,
            token,
            ed25519,
            p256,
            fleet,
            mode,
            callgrind_out,
        })
    }

    /// Runs `n` operations of `op`.
    async fn workload(&self, op: Op, n: usize) -> anyhow::Result<()> {
        let work = async {
            match op {
                Op::Relay => relay(&self.info, &self.ed25519, n).await,
                Op::Setup => setup(&self.info, &self.ed25519, n).await,
                Op::Login => logins(&self.info, &self.ed25519, "ins-ed", None, n).await,
                Op::LoginP256 => logins(&self.info, &self.p256, "ins-p256", None, n).await,
                Op::LoginX509 | Op::LoginX509Kept => {
                    let fleet = self.fleet.as_ref().context("no fleet certificates")?;
                    let presented = match op {
                        Op::LoginX509Kept => Presented::Enrolled,
                        _ => Presented::Renewed,
                    };
                    logins(
                        &self.info,
                        &self.p256,
                        X509_PREFIX,
                        Some((fleet, presented)),
                        n,
                    )
                    .await
                }
                Op::Arp => {
                    arp(
                        &self.info,
                        &self.token,
                        &self.ed25519,
                        Op::programs(self.mode),
                        Op::arp_window(self.mode),
                        n,
                    )
                    .await
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(900), work)
            .await
            .with_context(|| format!("{} workload of {n} timed out", op.name()))?
            .with_context(|| format!("{} workload of {n}", op.name()))
    }

    /// Waits until the server has used no CPU for a while: what a workload left behind
    /// (closes, records written later) is counted with it, not with the next.
    async fn settle(&self) -> anyhow::Result<()> {
        let interval = match self.mode {
            Mode::Callgrind => Duration::from_millis(400),
            Mode::Plain => Duration::from_millis(150),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = proc_stats(self.pid)?.1;
        loop {
            tokio::time::sleep(interval).await;
            let now = proc_stats(self.pid)?.1;
            if now == last || Instant::now() > deadline {
                return Ok(());
            }
            last = now;
        }
    }

    /// Marginal instructions per operation of `op`, under callgrind.
    async fn instructions(&self, op: Op, profiles: Option<&Path>) -> anyhow::Result<f64> {
        let (small, large) = op.sizes(Mode::Callgrind);
        // Once unmeasured: what the server does on first use only (the ARP schema compiled,
        // caches filled) belongs to no operation.
        self.workload(op, op.warm_up(Mode::Callgrind)).await?;
        let mut totals = Vec::new();
        for (label, n) in [("small", small), ("large", large)] {
            self.settle().await?;
            self.callgrind(&["--zero"]).await?;
            self.workload(op, n).await?;
            self.settle().await?;
            let (total, file) = self.dump().await?;
            eprintln!(
                "[instructions] {} {label} ({n}): {total} instructions",
                op.name()
            );
            if let Some(dir) = profiles {
                std::fs::create_dir_all(dir)?;
                std::fs::copy(&file, dir.join(format!("{}-{label}.callgrind", op.name())))?;
            }
            totals.push(total as f64);
        }
        Ok(marginal(totals[0], totals[1], small, large))
    }

    /// Marginal CPU µs per operation of `op` in a plain run, and the kernel's part of it.
    async fn cpu_us(&self, op: Op) -> anyhow::Result<(f64, f64)> {
        let (small, large) = op.sizes(Mode::Plain);
        self.workload(op, op.warm_up(Mode::Plain)).await?;
        let (mut used, mut kernel) = (Vec::new(), Vec::new());
        let us = |ticks: u64| ticks as f64 / clock_ticks() * 1e6;
        for n in [small, large] {
            self.settle().await?;
            let before = cpu_split(self.pid)?;
            self.workload(op, n).await?;
            self.settle().await?;
            let after = cpu_split(self.pid)?;
            let user = after.0.saturating_sub(before.0);
            let system = after.1.saturating_sub(before.1);
            used.push(us(user + system));
            kernel.push(us(system));
        }
        Ok((
            marginal(used[0], used[1], small, large),
            marginal(kernel[0], kernel[1], small, large),
        ))
    }

    async fn callgrind(&self, args: &[&str]) -> anyhow::Result<()> {
        let output = Command::new("callgrind_control")
            .args(args)
            .arg(self.pid.to_string())
            .output()
            .await
            .context("callgrind_control (valgrind's)")?;
        if !output.status.success() {
            bail!(
                "callgrind_control {args:?}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// Dumps callgrind's counters; the total of instructions since the last zero, and the
    /// file it went to.
    async fn dump(&self) -> anyhow::Result<(u64, PathBuf)> {
        let out = self
            .callgrind_out
            .as_deref()
            .context("not under callgrind")?;
        let dir = out.parent().context("callgrind folder")?;
        let before = dump_files(dir, out)?;
        self.callgrind(&["--dump"]).await?;
        let deadline = Instant::now() + WAIT;
        loop {
            let now = dump_files(dir, out)?;
            let changed = now
                .iter()
                .find(|(path, stamp)| before.get(path.as_path()) != Some(*stamp));
            if let Some((path, _)) = changed {
                // Written in one go by valgrind, but be sure it is complete: it ends with
                // its totals.
                let text = std::fs::read_to_string(path)?;
                if let Some(total) = callgrind_total(&text) {
                    return Ok((total, path.clone()));
                }
            }
            if Instant::now() > deadline {
                bail!("callgrind wrote no dump in {} s", WAIT.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Callgrind's files for `out` (`out`, `out.1`, ...) with their modification times and sizes.
fn dump_files(
    dir: &Path,
    out: &Path,
) -> anyhow::Result<BTreeMap<PathBuf, (std::time::SystemTime, u64)>> {
    let prefix = out
        .file_name()
        .and_then(|n| n.to_str())
        .context("callgrind file name")?;
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            let meta = entry.metadata()?;
            files.insert(entry.path(), (meta.modified()?, meta.len()));
        }
    }
    Ok(files)
}

/// The total of a callgrind profile (`summary:` or `totals:`, first event: instructions).
fn callgrind_total(text: &str) -> Option<u64> {
    let line = text
        .lines()
        .find(|l| l.starts_with("summary:"))
        .or_else(|| text.lines().find(|l| l.starts_with("totals:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// (large − small) / (n_large − n_small).
fn marginal(small: f64, large: f64, n_small: usize, n_large: usize) -> f64 {
    (large - small) / (n_large.saturating_sub(n_small).max(1)) as f64
}

// ---------------------------------------------------------------------------------------
// The workloads. Each opens what it needs, runs `n` operations, and closes it all.

/// The next text frame (pings are answered by tungstenite).
async fn next_text(socket: &mut Socket) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let frame = tokio::time::timeout_at(deadline, socket.next())
            .await
            .context("no message in time")?
            .context("socket closed")??;
        if let Message::Text(text) = frame {
            return Ok(text.as_str().to_string());
        }
    }
}

/// Closes a socket and reads it until the server's close (bounded).
async fn close(mut socket: Socket) {
    let _ = socket.close(None).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = socket.next().await {}
    })
    .await;
}

/// A verified robot and a client with a session to it (the client's connection id).
async fn session_pair(
    info: &TargetInfo,
    signer: &Signer,
    robot_id: &str,
) -> anyhow::Result<(Socket, Socket, Route)> {
    let robot = target::robot_login(info, robot_id, signer, Reads::Relay).await?;
    let (client, session) = target::client_login(info, Reads::Relay).await?;
    let route = Route::Ours {
        robot_id: robot_id.into(),
        session,
    };
    Ok((client, robot, route))
}

/// `n` ICE candidates of 250 B from the client to the robot, 32 in flight.
async fn relay(info: &TargetInfo, signer: &Signer, n: usize) -> anyhow::Result<()> {
    let (mut client, mut robot, route) = session_pair(info, signer, "ins-relay").await?;
    let Route::Ours { session, .. } = &route else {
        unreachable!("our route")
    };
    let offer = target::offer_message(&route, session, 200)?;
    client.send(Message::Text(offer.into())).await?;
    target::expect_type(&mut robot, "signalling.offer").await?;
    let template = target::DataTemplate::new(&route, Dir::AtoB, RELAY_SIZE)?;
    let (mut sent, mut received) = (0usize, 0usize);
    while received < n {
        while sent < n && sent - received < RELAY_WINDOW {
            sent += 1;
            let text = template.render(sent as u64);
            client.send(Message::Text(text.into())).await?;
        }
        let text = next_text(&mut robot).await?;
        if target::stamp_of(&text).is_some() {
            received += 1;
        } else if text.contains("signalling.error") {
            bail!("relay refused: {text}");
        }
    }
    close(client).await;
    close(robot).await;
    Ok(())
}

/// `n` sessions, one after the other: offer (2 KB SDP) → the robot's answer → hangup.
async fn setup(info: &TargetInfo, signer: &Signer, n: usize) -> anyhow::Result<()> {
    let (mut client, robot, route) = session_pair(info, signer, "ins-setup").await?;
    let Route::Ours {
        session: client_id, ..
    } = route.clone()
    else {
        unreachable!("our route")
    };
    let answering = tokio::spawn(answer_offers(robot, route.clone(), n));
    for k in 0..n {
        let session = format!("{client_id}-{k}");
        let offer = target::offer_message(&route, &session, SDP_SIZE)?;
        client.send(Message::Text(offer.into())).await?;
        loop {
            let text = next_text(&mut client).await?;
            if text.contains("signalling.error") {
                bail!("offer refused: {text}");
            }
            if text.contains("\"signalling.answer\"") {
                break;
            }
        }
        let hangup = target::hangup_message(&session);
        client.send(Message::Text(hangup.into())).await?;
    }
    close(client).await;
    let robot = answering.await??;
    close(robot).await;
    Ok(())
}

/// The robot of the setup workload: answers `n` offers, then gives its socket back.
async fn answer_offers(mut robot: Socket, route: Route, n: usize) -> anyhow::Result<Socket> {
    let mut answered = 0;
    while answered < n {
        let text = next_text(&mut robot).await?;
        let message: Value = serde_json::from_str(&text)?;
        if message["type"] != "signalling.offer" {
            continue;
        }
        let session = message["payload"]["connectionId"]
            .as_str()
            .context("offer without connectionId")?;
        let answer = target::answer_message(&route, session, SDP_SIZE)?;
        robot.send(Message::Text(answer.into())).await?;
        answered += 1;
    }
    Ok(robot)
}

/// Which certificate chain an X.509 login presents.
#[derive(Debug, Clone, Copy)]
enum Presented {
    /// The one the robot registered with: the server keeps its verification a while.
    Enrolled,
    /// A renewed leaf (another serial, the same key): verified in full at every login, as
    /// any chain is the first time a node sees it.
    Renewed,
}

/// `n` robot logins (register → challenge → signed response → verified → welcome), four
/// at a time, each socket closed once logged in; with `fleet`, each register presents the
/// robot's certificate chain: the one it enrolled with, or a renewed one for the same key.
async fn logins(
    info: &TargetInfo,
    signer: &Arc<Signer>,
    prefix: &str,
    fleet: Option<(&Arc<FleetChains>, Presented)>,
    n: usize,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..LOGIN_CONCURRENCY {
        let (info, signer, next, prefix, fleet) = (
            info.clone(),
            signer.clone(),
            next.clone(),
            prefix.to_string(),
            fleet.map(|(chains, presented)| (chains.clone(), presented)),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(());
                }
                let robot = format!("{prefix}-{}", i % LOGIN_POOL);
                let declared = match &fleet {
                    Some((fleet, Presented::Enrolled)) => {
                        json!({ "certificate": fleet.chain(i % LOGIN_POOL) })
                    }
                    Some((fleet, Presented::Renewed)) => {
                        json!({ "certificate": fleet.renewed_chain(i % LOGIN_POOL) })
                    }
                    None => json!({}),
                };
                let socket =
                    target::robot_login_declaring(&info, &robot, &signer, Reads::Small, declared)
                        .await?;
                close(socket).await;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// `n` `arp.callTool`s through the gateway, shared by `programs` programs, each with its
/// own stand-in robot (answering at once, and the session ticket's key exchange as
/// robot-agent does); each program keeps `window` calls in flight, at most 40 a second.
async fn arp(
    info: &TargetInfo,
    token: &str,
    signer: &Signer,
    programs: usize,
    window: usize,
    n: usize,
) -> anyhow::Result<()> {
    let mut robots = Vec::new();
    for i in 0..programs {
        let socket = target::robot_login_declaring(
            info,
            &format!("ins-arp-{i}"),
            signer,
            Reads::Small,
            json!({"arp": "0.1.0"}),
        )
        .await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        robots.push((stop, tokio::spawn(stand_in_robot(socket, stopped))));
    }
    let gateway = info.ws_url.trim_end_matches("/ws");
    let mut tasks = Vec::new();
    for i in 0..programs {
        let url = format!("{gateway}/v1/robots/ins-arp-{i}/arp?token={token}");
        let mut socket = target::connect(&url, Reads::Small).await?;
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "arp.initialize",
            "params": {"protocolVersion": "0.1.0", "clientInfo": {"name": "bench", "version": "1"},
                       "capabilities": {}}});
        socket
            .send(Message::Text(initialize.to_string().into()))
            .await?;
        let answer: Value = serde_json::from_str(&next_text(&mut socket).await?)?;
        if answer.get("result").is_none() {
            bail!("arp.initialize: {answer}");
        }
        let calls = n / programs + usize::from(i < n % programs);
        tasks.push(tokio::spawn(program(socket, calls, window)));
    }
    for task in tasks {
        close(task.await??).await;
    }
    for (stop, robot) in robots {
        let _ = stop.send(());
        close(robot.await??).await;
    }
    Ok(())
}

/// A program: `calls` tool calls, `in_flight` at a time, paced; every answer must be a
/// success.
async fn program(socket: Socket, calls: usize, in_flight: usize) -> anyhow::Result<Socket> {
    let (mut sink, mut stream) = socket.split();
    let window = Arc::new(Semaphore::new(in_flight));
    let permits = window.clone();
    let sender = async move {
        let mut next = tokio::time::Instant::now();
        for id in 1..=calls {
            permits.acquire().await?.forget();
            tokio::time::sleep_until(next).await;
            next += ARP_PACE;
            let frame = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"arp.callTool","params":{{"name":"noop","arguments":{{"speed":0.5}}}}}}"#
            );
            sink.send(Message::Text(frame.into())).await?;
        }
        anyhow::Ok(sink)
    };
    let receiver = async move {
        let mut answered = 0;
        while answered < calls {
            let frame = tokio::time::timeout(WAIT, stream.next())
                .await
                .context("no answer in time")?
                .context("gateway closed")??;
            let Message::Text(text) = frame else { continue };
            let value: Value = serde_json::from_str(text.as_str())?;
            if value.get("error").is_some() {
                bail!("arp.callTool failed: {value}");
            }
            if value.get("result").is_some() {
                answered += 1;
                window.add_permits(1);
            }
        }
        anyhow::Ok(stream)
    };
    let (sink, stream) = tokio::try_join!(sender, receiver)?;
    sink.reunite(stream)
        .map_err(|_| anyhow::anyhow!("the halves of two sockets"))
}

/// A stand-in robot: answers every request of an `arp.frame` at once until told to stop;
/// gives its socket back.
async fn stand_in_robot(
    mut socket: Socket,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> anyhow::Result<Socket> {
    loop {
        let frame = tokio::select! {
            _ = &mut stop => return Ok(socket),
            frame = socket.next() => frame,
        };
        let Some(frame) = frame else {
            bail!("the server closed a stand-in robot")
        };
        let Message::Text(text) = frame? else {
            continue;
        };
        let value: Value = serde_json::from_str(text.as_str())?;
        if value["type"] != "arp.frame" {
            continue;
        }
        let frame = &value["payload"]["frame"];
        let (Some(id), Some(method)) = (frame.get("id"), frame["method"].as_str()) else {
            continue;
        };
        let result = match method {
            "arp.initialize" => json!({
                "protocolVersion": "0.1.0",
                "serverInfo": { "name": "stand-in", "version": "1" },
                "capabilities": { "tools": true, "context": true, "constraints": true,
                                  "planning": false, "confirmation": true },
            }),
            "arp.callTool" => {
                json!({ "callId": format!("c{id}"), "state": "completed", "result": {} })
            }
            _ => json!({}),
        };
        // Written as robot-agent writes an envelope: its members in the spec's order.
        let payload = json!({
            "connectionId": value["payload"]["connectionId"],
            "frame": { "jsonrpc": "2.0", "id": id, "result": result },
        });
        let meta = crate::target::key_exchange_answer(&value)
            .map(|half| format!(r#","meta":{}"#, json!({ KEY_EXCHANGE_META_KEY: half })))
            .unwrap_or_default();
        let answer = format!(
            r#"{{"type":"arp.frame","version":"0.5","id":"{}","timestamp":"2026-01-01T00:00:00Z","payload":{payload}{meta}}}"#,
            uuid::Uuid::new_v4()
        );
        socket.send(Message::Text(answer.into())).await?;
    }
}

/// `meta` key of a robot's half of a ticket's key exchange (signalling_protocol's
/// `ticket::KEY_EXCHANGE_META_KEY`; the bench does not link the protocol crate).
const KEY_EXCHANGE_META_KEY: &str = "ticketKey";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marginal_cost_cancels_what_both_workloads_share() {
        // 1,000 once, 10 per operation.
        assert_eq!(
            marginal(1_000.0 + 10.0 * 5.0, 1_000.0 + 10.0 * 35.0, 5, 35),
            10.0
        );
    }

    #[test]
    fn totals_are_read_from_a_callgrind_profile() {
        let text = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfn=main\n3 7\nsummary: 123456\ntotals: 123456\n";
        assert_eq!(callgrind_total(text), Some(123_456));
        assert_eq!(callgrind_total("totals: 42\n"), Some(42));
        assert_eq!(callgrind_total("events: Ir\n"), None);
    }

    #[test]
    fn a_regression_over_the_tolerance_fails_and_a_gain_asks_for_a_new_baseline() {
        let figures = |i: f64| Figures {
            instructions_per_op: Some(i),
            ..Figures::default()
        };
        let baseline: BTreeMap<String, Figures> = [
            ("relay".to_string(), figures(1_000.0)),
            ("arp".to_string(), figures(100_000.0)),
        ]
        .into();
        let fine: BTreeMap<String, Figures> = [
            ("relay".to_string(), figures(1_090.0)),
            ("arp".to_string(), figures(50_000.0)),
            ("setup".to_string(), figures(7.0)),
        ]
        .into();
        let (report, regressed) = check(&baseline, &fine, 0.10);
        assert!(!regressed, "{report}");
        assert!(report.contains("update the baseline"), "{report}");
        assert!(
            report.contains("setup: 7 instructions/op, no baseline"),
            "{report}"
        );
        let worse: BTreeMap<String, Figures> = [("relay".to_string(), figures(1_101.0))].into();
        let (report, regressed) = check(&baseline, &worse, 0.10);
        assert!(regressed, "{report}");
        assert!(report.contains("REGRESSION"), "{report}");
    }

    #[test]
    fn every_operation_has_a_name_and_a_larger_large_workload() {
        for op in OPS {
            assert_eq!(Op::parse(op.name()).unwrap(), op);
            for mode in [Mode::Callgrind, Mode::Plain] {
                let (small, large) = op.sizes(mode);
                assert!(large > small, "{op:?} {mode:?}");
            }
        }
        assert!(Op::parse("nonsense").is_err());
    }
}
