//! Several nodes (issue 14): the relay with the client on node B and the robot on node A,
//! against both ends on node A of the same cluster, in one run (same build, same machine,
//! same moment), so the ratio shows what the Redis hop costs.
//!
//! Three nodes on one PostgreSQL schema and a Redis of their own (on a free port); robots
//! and the client token are prepared once through node A's admin API.
//!
//! The capacity of the three nodes together: idle verified robots (and half as many
//! clients), three times the single node's count, with the capacity workers spread
//! round-robin over the nodes (each node, like each worker, is a process with its own
//! open-file limit).

use std::process::Stdio;

use anyhow::Context;
use tokio::process::{Child, Command};

use super::process::{free_port, fresh_postgres_schema, prepare, wait_listening, Keys, Running};
use super::scenarios::capacity_over;
use super::{relay, row, Options, Row};
use crate::target::TargetInfo;

const NODES: usize = 3;

/// As deploy/docker-compose.yml sets it: Redis's default (32 MB, or 8 MB for 60 s) closes a
/// node's subscription when a burst of relayed frames outruns it, and what it held is lost
/// (docs/deployment.md, "Redis").
const REDIS_PUBSUB_LIMIT: [&str; 2] = ["--client-output-buffer-limit", "pubsub 512mb 256mb 60"];

/// Starts one node of the cluster; returns its port and process.
async fn start_node(
    opts: &Options,
    database: &str,
    redis: &str,
    prefix: &str,
    index: usize,
) -> anyhow::Result<(u16, Child)> {
    let port = free_port()?;
    let mut child = Command::new(&opts.server_bin)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-token", super::process::ADMIN])
        .args(["--database-url", database, "--redis-url", redis])
        .args([
            "--redis-prefix",
            prefix,
            "--node-id",
            &format!("bench-node-{index}"),
        ])
        .args(super::process::UNLIMITED)
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", opts.server_bin.display()))?;
    wait_listening(port, &mut child).await?;
    Ok((port, child))
}

fn info(name: &str, client_port: u16, robot_port: u16, token: &str, keys: &Keys) -> TargetInfo {
    let mut info = keys.target_info(name, &format!("ws://127.0.0.1:{client_port}/ws"), token);
    info.robot_ws_url = Some(format!("ws://127.0.0.1:{robot_port}/ws"));
    info
}

/// A private redis-server on a free port (pub/sub buffers as the nodes need).
async fn start_redis() -> anyhow::Result<(u16, Child)> {
    let redis_port = free_port()?;
    let mut redis = Command::new("redis-server")
        .args(["--port", &redis_port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(REDIS_PUBSUB_LIMIT)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("redis-server")?;
    wait_listening(redis_port, &mut redis).await?;
    Ok((redis_port, redis))
}

/// The idle capacity of every node together, robots spread over them.
async fn capacity_of_nodes(
    opts: &Options,
    keys: &Keys,
    nodes: &[(u16, Child)],
    token: &str,
    capacity_robots: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let targets: Vec<TargetInfo> = nodes
        .iter()
        .map(|(port, _)| info("cluster, 3 nodes", *port, *port, token, keys))
        .map(|mut i| {
            i.robot_ws_url = None;
            i
        })
        .collect();
    let pids: Vec<u32> = nodes
        .iter()
        .map(|(_, child)| child.id().context("node pid"))
        .collect::<anyhow::Result<_>>()?;
    eprintln!("[bench] cluster: capacity of {NODES} nodes ({capacity_robots} robots)");
    capacity_over(
        opts,
        "cluster, 3 nodes",
        &targets,
        &pids,
        capacity_robots,
        rows,
    )
    .await
}

/// Cross-node over same-node rows of the same benchmark and metric.
fn ratios(measured: &[Row], same: &str, cross: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for same_row in measured.iter().filter(|r| r.target == same) {
        let Some(cross_row) = measured.iter().find(|r| {
            r.target == cross && r.benchmark == same_row.benchmark && r.metric == same_row.metric
        }) else {
            continue;
        };
        if same_row.value > 0.0 {
            rows.push(row(
                &same_row.benchmark,
                "cluster, cross-node ÷ same node",
                &format!("{} ratio", same_row.metric),
                cross_row.value / same_row.value,
                "×",
            ));
        }
        if let (Some(s), Some(c)) = (&same_row.latency, &cross_row.latency) {
            if s.p50_us > 0.0 {
                rows.push(row(
                    &same_row.benchmark,
                    "cluster, cross-node ÷ same node",
                    "p50 latency ratio",
                    c.p50_us / s.p50_us,
                    "×",
                ));
            }
        }
    }
    rows
}

/// Same-node and cross-node relay on three nodes; rows named "… same node" and "…
/// cross-node", plus their ratios; and the idle capacity of the three nodes.
pub async fn cluster(
    opts: &Options,
    keys: &Keys,
    postgres: &str,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let wants = |name: &str| opts.only.iter().any(|o| o == name);
    let (redis_port, mut redis) = start_redis().await?;
    let redis_url = format!("redis://127.0.0.1:{redis_port}");
    let database = fresh_postgres_schema(postgres).await?;
    let prefix = format!("bench-{}:", uuid::Uuid::new_v4().simple());
    let mut nodes = Vec::new();
    for index in 0..NODES {
        nodes.push(start_node(opts, &database, &redis_url, &prefix, index).await?);
    }
    let capacity_robots = if wants("capacity") {
        opts.profile.capacity_robots * NODES
    } else {
        0
    };
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", nodes[0].0);
    let robots = capacity_robots.max(opts.profile.relay_sessions);
    eprintln!("[bench] cluster: preparing {robots} robots");
    let token = prepare(&http, &base, keys, robots, 0).await?;
    if wants("capacity") {
        capacity_of_nodes(opts, keys, &nodes, &token, capacity_robots, rows).await?;
    }
    let (a, b) = (nodes[0].0, nodes[1].0);
    let mut children = nodes.into_iter().map(|(_, child)| child);
    let (node_a, node_b) = (
        children.next().context("node A")?,
        children.next().context("node B")?,
    );
    let same = Running::adopt(info("cluster, same node", a, a, &token, keys), node_a);
    let cross = Running::adopt(info("cluster, cross-node", b, a, &token, keys), node_b);
    if !wants("relay") {
        same.stop().await;
        cross.stop().await;
        for mut child in children {
            let _ = child.kill().await;
        }
        let _ = redis.kill().await;
        return Ok(());
    }
    let first = rows.len();
    relay(opts, &same, rows).await?;
    relay(opts, &cross, rows).await?;
    let measured: Vec<Row> = rows[first..].to_vec();
    rows.extend(ratios(&measured, &same.info.name, &cross.info.name));
    same.stop().await;
    cross.stop().await;
    for mut child in children {
        let _ = child.kill().await;
    }
    let _ = redis.kill().await;
    Ok(())
}
