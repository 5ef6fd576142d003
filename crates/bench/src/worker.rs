//! A load-generator process: runs one scenario against one target and reports JSON lines on
//! stdout (`ready`, then `result`). Several run side by side when one process would pass the
//! open-file limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::serialization::Serializer as _;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;

use crate::target::{self, Dir, Kind, Pair, Reads, Route, Signer, Socket, TargetInfo};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "scenario", rename_all = "snake_case")]
pub enum Scenario {
    /// Idle sockets: `robots` robots (verified on ours) and `clients` clients.
    Capacity {
        first: usize,
        robots: usize,
        clients: usize,
    },
    /// `sessions` pairs exchanging `size`-byte messages in direction `dir`.
    Relay {
        sessions: usize,
        size: usize,
        b_to_a: bool,
        /// Messages per second over all sessions; `None` saturates with a window per session.
        rate: Option<u64>,
        window: usize,
        secs: f64,
    },
    /// `robots` robots connecting at once and proving their identity (ours only).
    Storm {
        first: usize,
        robots: usize,
        p256: bool,
        concurrency: usize,
    },
    /// Offers answered per second: each pair opens, answers and ends sessions in a loop.
    Setup {
        sessions: usize,
        sdp_size: usize,
        secs: f64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    pub target: TargetInfo,
    pub scenario: Scenario,
    /// Makes relay ids and rooms unique between workers.
    pub tag: String,
}

/// Latency summary in microseconds plus the raw histogram for merging.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Latency {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Base64 V2 serialisation of the histogram (nanoseconds).
    pub histogram: String,
}

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("valid histogram bounds")
}

pub fn summarize(histogram: &Histogram<u64>) -> Latency {
    let mut buffer = Vec::new();
    let _ = hdrhistogram::serialization::V2Serializer::new().serialize(histogram, &mut buffer);
    let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    Latency {
        count: histogram.len(),
        p50_us: us(0.5),
        p99_us: us(0.99),
        p999_us: us(0.999),
        max_us: histogram.max() as f64 / 1000.0,
        histogram: base64::Engine::encode(&base64::engine::general_purpose::STANDARD, buffer),
    }
}

pub fn deserialize(latency: &Latency) -> anyhow::Result<Histogram<u64>> {
    let bytes = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        &latency.histogram,
    )?;
    hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| anyhow::anyhow!("histogram: {e:?}"))
}

fn emit(value: Value) {
    println!("{value}");
}

pub async fn run(spec: Spec) -> anyhow::Result<()> {
    match spec.scenario.clone() {
        Scenario::Capacity {
            first,
            robots,
            clients,
        } => capacity(&spec, first, robots, clients).await,
        Scenario::Relay {
            sessions,
            size,
            b_to_a,
            rate,
            window,
            secs,
        } => relay(&spec, sessions, size, b_to_a, rate, window, secs).await,
        Scenario::Storm {
            first,
            robots,
            p256,
            concurrency,
        } => storm(&spec, first, robots, p256, concurrency).await,
        Scenario::Setup {
            sessions,
            sdp_size,
            secs,
        } => setup(&spec, sessions, sdp_size, secs).await,
    }
}

/// Waits for the orchestrator to say `go` (or to close stdin).
async fn wait_for(word: &str) {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim() == word {
            return;
        }
    }
}

/// Keeps reading a socket (answering pings) until it closes.
fn drain(mut stream: SplitStream<Socket>) {
    tokio::spawn(async move { while let Some(Ok(_)) = stream.next().await {} });
}

async fn open_idle(
    info: &TargetInfo,
    signer: Option<&Signer>,
    tag: &str,
    robot: bool,
    index: usize,
) -> anyhow::Result<Socket> {
    match info.kind {
        Kind::Ours if robot => {
            let signer = signer.context("key")?;
            target::robot_login(info, &format!("bench-{index}"), signer, Reads::Small).await
        }
        Kind::Ours => Ok(target::client_login(info, Reads::Small).await?.0),
        Kind::Relay => {
            let role = if robot { "r" } else { "c" };
            let mut socket = target::connect(
                &format!("{}?id={tag}{role}{index}", info.ws_url),
                Reads::Small,
            )
            .await?;
            target::next_json(&mut socket).await?;
            Ok(socket)
        }
        Kind::Matchbox => {
            let role = if robot { "r" } else { "c" };
            let url = format!("{}/{tag}{role}{index}", info.ws_url.trim_end_matches('/'));
            let mut socket = target::connect(&url, Reads::Small).await?;
            target::next_json(&mut socket).await?;
            Ok(socket)
        }
    }
}

/// Runs `jobs` as tasks, at most `limit` at once (like a fleet coming up, not a single
/// burst), and gives their results in order; any failure fails the lot.
async fn gated<T, Job>(limit: usize, jobs: impl IntoIterator<Item = Job>) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    Job: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let gate = Arc::new(Semaphore::new(limit));
    let tasks: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let gate = gate.clone();
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await?;
                job.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await??);
    }
    Ok(results)
}

/// Our server's robots' signer (none for the other targets).
fn robot_signer(spec: &Spec) -> anyhow::Result<Option<Arc<Signer>>> {
    Ok(match spec.target.kind {
        Kind::Ours => Some(Arc::new(Signer::from_info(&spec.target, false)?)),
        _ => None,
    })
}

async fn capacity(spec: &Spec, first: usize, robots: usize, clients: usize) -> anyhow::Result<()> {
    let signer = robot_signer(spec)?;
    let started = Instant::now();
    let jobs = [(true, robots), (false, clients)]
        .into_iter()
        .flat_map(|(robot, count)| (0..count).map(move |i| (robot, i)))
        .map(|(robot, i)| {
            let (info, signer, tag) = (spec.target.clone(), signer.clone(), spec.tag.clone());
            async move { open_idle(&info, signer.as_deref(), &tag, robot, first + i).await }
        });
    let sockets = gated(256, jobs).await?;
    let connect_secs = started.elapsed().as_secs_f64();
    let mut sinks = Vec::with_capacity(sockets.len());
    for socket in sockets {
        let (sink, stream) = socket.split();
        sinks.push(sink);
        drain(stream);
    }
    emit(json!({"event": "ready", "sockets": sinks.len(), "connect_secs": connect_secs}));
    wait_for("exit").await;
    drop(sinks);
    Ok(())
}

async fn open_pairs(spec: &Spec, count: usize) -> anyhow::Result<Vec<Pair>> {
    let signer = robot_signer(spec)?;
    let jobs = (0..count).map(|i| {
        let (info, signer, tag) = (spec.target.clone(), signer.clone(), spec.tag.clone());
        async move { target::open_pair(&info, signer.as_deref(), i, &tag).await }
    });
    gated(64, jobs).await
}

/// A session's share of a fixed total `rate`, its sends spread over the period
/// (`aligned`: all at once, for BENCH_ALIGNED_PHASES=1).
fn pacing(rate: Option<u64>, sessions: usize, index: usize, aligned: bool) -> Option<Pacing> {
    rate.map(|r| Pacing {
        per_session: r as f64 / sessions as f64,
        phase: if aligned {
            0.0
        } else {
            index as f64 / sessions as f64
        },
    })
}

type Sink = SplitSink<Socket, Message>;

#[allow(clippy::too_many_arguments)]
async fn relay(
    spec: &Spec,
    sessions: usize,
    size: usize,
    b_to_a: bool,
    rate: Option<u64>,
    window: usize,
    secs: f64,
) -> anyhow::Result<()> {
    let pairs = open_pairs(spec, sessions).await?;
    emit(json!({"event": "ready", "sessions": pairs.len()}));
    wait_for("go").await;

    let clock = Instant::now();
    let stop_at = clock + Duration::from_secs_f64(secs);
    let received = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let dir = if b_to_a { Dir::BtoA } else { Dir::AtoB };
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    let aligned = std::env::var("BENCH_ALIGNED_PHASES").is_ok_and(|v| v == "1");
    for (index, pair) in pairs.into_iter().enumerate() {
        let Pair { a, b, route } = pair;
        let (a_sink, a_stream) = a.split();
        let (b_sink, b_stream) = b.split();
        let (sink, stream, idle_sink, idle_stream): (Sink, _, Sink, _) = if b_to_a {
            (b_sink, a_stream, a_sink, b_stream)
        } else {
            (a_sink, b_stream, b_sink, a_stream)
        };
        let permits = Arc::new(Semaphore::new(window.max(1)));
        watch_refusals(idle_stream, permits.clone(), refused.clone());
        senders.push(tokio::spawn(send_loop(
            sink,
            route,
            dir,
            size,
            pacing(rate, sessions, index, aligned),
            permits.clone(),
            clock,
            stop_at,
            sent.clone(),
        )));
        receivers.push(tokio::spawn(receive_loop(
            stream,
            permits,
            clock,
            stop_at,
            received.clone(),
        )));
        // Kept open until the end so the pair's sessions stay alive.
        senders.push(tokio::spawn(async move {
            let _keep = idle_sink;
            tokio::time::sleep_until(stop_at.into()).await;
            Ok(())
        }));
    }
    for task in senders {
        task.await??;
    }
    let mut histogram = new_histogram();
    for task in receivers {
        histogram.add(task.await??)?;
    }
    let elapsed = clock.elapsed().as_secs_f64().min(secs);
    let received = received.load(Ordering::Relaxed);
    emit(json!({
        "event": "result",
        "sent": sent.load(Ordering::Relaxed),
        "refused": refused.load(Ordering::Relaxed),
        "received": received,
        "secs": elapsed,
        "throughput": received as f64 / elapsed,
        "latency": summarize(&histogram),
    }));
    Ok(())
}

/// Reads the sender's own socket: a message the target refused (an error, e.g.
/// `relay_throttled`) never reaches the receiver, so its window slot is given back here and
/// the refusal counted, instead of the window shrinking unseen.
fn watch_refusals(
    mut stream: SplitStream<Socket>,
    permits: Arc<Semaphore>,
    refused: Arc<AtomicU64>,
) {
    tokio::spawn(async move {
        while let Some(Ok(frame)) = stream.next().await {
            if let Message::Text(text) = frame {
                if text.contains("signalling.error") {
                    refused.fetch_add(1, Ordering::Relaxed);
                    permits.add_permits(1);
                }
            }
        }
    });
}

/// How a session of a fixed-load run sends: `per_session` messages a second, the first at
/// `phase` (0..1) of a period after the start.
///
/// Phases are spread evenly over the sessions, so the offered load is even: with every
/// session starting at once, all of them sent in the same tick of the timer, and the run
/// measured how fast a relay drains a burst of as many messages as there are sessions
/// rather than its latency at the offered rate. `BENCH_ALIGNED_PHASES=1` brings the bursts
/// back (phase 0 for all), for comparisons with runs made before.
#[derive(Debug, Clone, Copy)]
struct Pacing {
    per_session: f64,
    phase: f64,
}

#[allow(clippy::too_many_arguments)]
async fn send_loop(
    mut sink: Sink,
    route: Route,
    dir: Dir,
    size: usize,
    pacing: Option<Pacing>,
    permits: Arc<Semaphore>,
    clock: Instant,
    stop_at: Instant,
    sent: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let mut ticker = pacing.map(|Pacing { per_session, phase }| {
        let period = Duration::from_secs_f64(1.0 / per_session.max(0.001));
        let first = tokio::time::Instant::from_std(clock) + period.mul_f64(phase.clamp(0.0, 1.0));
        let mut interval = tokio::time::interval_at(first, period);
        // Open loop: a late tick is made up for, so the offered rate holds.
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        interval
    });
    let template = target::DataTemplate::new(&route, dir, size)?;
    while Instant::now() < stop_at {
        match ticker.as_mut() {
            Some(interval) => {
                tokio::select! {
                    _ = interval.tick() => {}
                    _ = tokio::time::sleep_until(stop_at.into()) => break,
                }
            }
            None => {
                tokio::select! {
                    permit = permits.acquire() => permit?.forget(),
                    _ = tokio::time::sleep_until(stop_at.into()) => break,
                }
            }
        }
        let stamp = clock.elapsed().as_nanos() as u64;
        let text = template.render(stamp.max(1));
        sink.send(Message::Text(text.into())).await?;
        sent.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

async fn receive_loop(
    mut stream: SplitStream<Socket>,
    permits: Arc<Semaphore>,
    clock: Instant,
    stop_at: Instant,
    received: Arc<AtomicU64>,
) -> anyhow::Result<Histogram<u64>> {
    let mut histogram = new_histogram();
    loop {
        let frame = tokio::select! {
            frame = stream.next() => frame,
            _ = tokio::time::sleep_until(stop_at.into()) => break,
        };
        match frame {
            Some(Ok(Message::Text(text))) => {
                if let Some(stamp) = target::stamp_of(&text) {
                    let now = clock.elapsed().as_nanos() as u64;
                    histogram.saturating_record(now.saturating_sub(stamp).max(1));
                    received.fetch_add(1, Ordering::Relaxed);
                    permits.add_permits(1);
                } else if text.contains("signalling.error") {
                    bail!("target refused a message: {text}");
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => bail!("receive failed: {e}"),
            None => bail!("socket closed during the run"),
        }
    }
    Ok(histogram)
}

async fn storm(
    spec: &Spec,
    first: usize,
    robots: usize,
    p256: bool,
    concurrency: usize,
) -> anyhow::Result<()> {
    if spec.target.kind != Kind::Ours {
        bail!("the registration storm needs our server's PKI login");
    }
    let signer = Arc::new(Signer::from_info(&spec.target, p256)?);
    emit(json!({"event": "ready"}));
    wait_for("go").await;
    let prefix = if p256 { "storm-p256" } else { "storm-ed" };
    let started = Instant::now();
    let jobs = (first..first + robots).map(|i| {
        let (info, signer) = (spec.target.clone(), signer.clone());
        async move {
            let begun = Instant::now();
            let socket =
                target::robot_login(&info, &format!("{prefix}-{i}"), &signer, Reads::Small).await?;
            anyhow::Ok((begun.elapsed(), socket))
        }
    });
    let mut histogram = new_histogram();
    let mut sockets = Vec::with_capacity(robots);
    for (took, socket) in gated(concurrency.max(1), jobs).await? {
        histogram.saturating_record(took.as_nanos() as u64);
        sockets.push(socket);
    }
    let wall = started.elapsed().as_secs_f64();
    emit(json!({
        "event": "result",
        "robots": robots,
        "secs": wall,
        "per_sec": robots as f64 / wall,
        "latency": summarize(&histogram),
    }));
    wait_for("exit").await;
    drop(sockets);
    Ok(())
}

/// The robot end of a session-setup pair: answers every offer it gets.
async fn answer_offers(
    mut b_sink: Sink,
    mut b_stream: SplitStream<Socket>,
    route: Route,
    sdp_size: usize,
) -> anyhow::Result<()> {
    while let Some(Ok(frame)) = b_stream.next().await {
        let Message::Text(text) = frame else { continue };
        let session = if matches!(route, Route::Ours { .. }) {
            let message: Value = serde_json::from_str(&text)?;
            if message["type"] != "signalling.offer" {
                continue;
            }
            message["payload"]["connectionId"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        } else {
            String::new()
        };
        let answer = target::answer_message(&route, &session, sdp_size)?;
        if b_sink.send(Message::Text(answer.into())).await.is_err() {
            break;
        }
    }
    Ok(())
}

async fn setup(spec: &Spec, sessions: usize, sdp_size: usize, secs: f64) -> anyhow::Result<()> {
    let pairs = open_pairs(spec, sessions).await?;
    emit(json!({"event": "ready", "sessions": pairs.len()}));
    wait_for("go").await;
    let stop_at = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (index, pair) in pairs.into_iter().enumerate() {
        let Pair { a, b, route } = pair;
        let (mut a_sink, mut a_stream) = a.split();
        let (b_sink, b_stream) = b.split();
        let robot = tokio::spawn(answer_offers(b_sink, b_stream, route.clone(), sdp_size));
        let tag = spec.tag.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = new_histogram();
            let mut n = 0u64;
            while Instant::now() < stop_at {
                let session = format!("{tag}-{index}-{n}");
                let begun = Instant::now();
                let offer = target::offer_message(&route, &session, sdp_size)?;
                a_sink.send(Message::Text(offer.into())).await?;
                // For the answer, whatever pings come meanwhile.
                let answer_by = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    let frame = tokio::time::timeout_at(answer_by, a_stream.next())
                        .await
                        .context("no answer in time")?;
                    match frame {
                        Some(Ok(Message::Text(text))) if text.contains("signalling.error") => {
                            bail!("offer refused: {text}")
                        }
                        Some(Ok(Message::Text(_))) => break,
                        Some(Ok(_)) => continue,
                        _ => bail!("client socket closed"),
                    }
                }
                histogram.saturating_record(begun.elapsed().as_nanos() as u64);
                n += 1;
                if matches!(route, Route::Ours { .. }) {
                    a_sink
                        .send(Message::Text(target::hangup_message(&session).into()))
                        .await?;
                }
            }
            drop(a_sink);
            robot.abort();
            anyhow::Ok((n, histogram))
        }));
    }
    let mut total = 0;
    let mut histogram = new_histogram();
    for task in tasks {
        let (n, h) = task.await??;
        total += n;
        histogram.add(h)?;
    }
    emit(json!({
        "event": "result",
        "completed": total,
        "secs": secs,
        "per_sec": total as f64 / secs,
        "latency": summarize(&histogram),
    }));
    Ok(())
}
