//! The JSON-RPC 2.0 line protocol shared by the `exec:` and `serial:`
//! drivers: one JSON object per line, in both directions.
//!
//! Agent → driver: notifications `move {linear, angular}` and
//! `stop {reason}`; requests `navigate {name, position, orientation?}` and
//! `cancel_navigation {}`. Driver → agent: notification `ready` (first),
//! then any time `navigation_status {name, status, message?}` and
//! `emergency_stop {reason}`, plus responses to the requests.
//!
//! The transport only moves lines; this module is the protocol, written
//! against two channels so the same code serves pipes and serial ports.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use serde_json::{json, Value};
use signalling_protocol::NavigationStatus;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio::sync::mpsc;

use super::{DriverCommand, DriverEnd, DriverError, DriverEvent, Reply, REQUEST_TIMEOUT};
use crate::safety::StopReason;

/// Longest accepted line; a longer one is dropped (a confused or hostile
/// peer must not make the agent buffer without bound).
pub const MAX_LINE: usize = 64 * 1024;

/// Capacity of the line channels.
pub const LINE_CHANNEL: usize = 64;

/// Why a connection to the driver ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ConnectionEnd {
    /// The peer went away (process exit, port closed); restart it.
    Lost,
    /// The controller is gone: the agent is shutting down.
    ControllerGone,
}

/// Reads newline-terminated lines into `tx` until EOF or error; lines longer
/// than [`MAX_LINE`] are skipped whole.
pub async fn read_lines<R: AsyncBufRead + Unpin>(mut reader: R, tx: mpsc::Sender<String>) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let mut overlong = false;
        loop {
            let chunk = match reader.fill_buf().await {
                Ok(chunk) => chunk,
                Err(_) => return,
            };
            if chunk.is_empty() {
                return;
            }
            let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if !overlong {
                if buf.len() + take > MAX_LINE + 1 {
                    overlong = true;
                    buf.clear();
                } else {
                    buf.extend_from_slice(&chunk[..take]);
                }
            }
            reader.consume(take);
            if done {
                break;
            }
        }
        if overlong {
            tracing::warn!("driver sent a line longer than {MAX_LINE} bytes; dropped");
            continue;
        }
        let line = String::from_utf8_lossy(&buf).trim().to_owned();
        if line.is_empty() {
            continue;
        }
        if tx.send(line).await.is_err() {
            return;
        }
    }
}

/// What waits for a driver's response.
enum Waiter {
    Done(Reply),
    Value(super::ToolReply),
}

impl Waiter {
    fn fail(self, error: DriverError) {
        match self {
            Waiter::Done(reply) => {
                let _ = reply.send(Err(error));
            }
            Waiter::Value(reply) => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

struct Pending {
    reply: Waiter,
    deadline: Instant,
}

/// Serves one connection. Waits for `ready`, stops the robot (so a restarted
/// driver starts from rest), reports `Ready`, then relays until either side
/// goes away.
pub async fn serve(
    lines_in: &mut mpsc::Receiver<String>,
    lines_out: &mpsc::Sender<String>,
    end: &mut DriverEnd,
    stop_reason: StopReason,
) -> ConnectionEnd {
    if let Err(ended) = await_ready(lines_in, end).await {
        return ended;
    }
    tracing::info!("driver ready");
    let stop = notification("stop", json!({ "reason": stop_reason.as_str() }));
    if lines_out.send(stop).await.is_err() {
        return ConnectionEnd::Lost;
    }
    if end.events.send(DriverEvent::Ready).await.is_err() {
        return ConnectionEnd::ControllerGone;
    }
    relay(lines_in, lines_out, end).await
}

/// Phase 1: nothing is sent until the driver says it is ready (its tools
/// are taken from that message); commands meanwhile are refused.
async fn await_ready(
    lines_in: &mut mpsc::Receiver<String>,
    end: &mut DriverEnd,
) -> Result<(), ConnectionEnd> {
    loop {
        tokio::select! {
            line = lines_in.recv() => {
                let Some(line) = line else { return Err(ConnectionEnd::Lost) };
                match serde_json::from_str::<Value>(&line) {
                    Ok(msg) if msg.get("method").and_then(Value::as_str) == Some("ready") => {
                        let tools = declared_tools(msg.get("params"));
                        if !tools.is_empty() {
                            tracing::info!(tools = tools.len(), "driver declares tools");
                        }
                        end.tools.send_replace(tools);
                        return Ok(());
                    }
                    Ok(_) => tracing::debug!(%line, "driver message before ready; ignored"),
                    Err(e) => tracing::warn!(error = %e, "driver sent invalid JSON"),
                }
            }
            command = end.commands.recv() => {
                let Some(command) = command else { return Err(ConnectionEnd::ControllerGone) };
                refuse(command);
            }
        }
    }
}

/// A request to the driver awaiting its answer: id, who waits, how long.
type Awaited = (u64, Waiter, Duration);

/// Phase 2: commands out, answers and events in, late answers failed.
async fn relay(
    lines_in: &mut mpsc::Receiver<String>,
    lines_out: &mpsc::Sender<String>,
    end: &mut DriverEnd,
) -> ConnectionEnd {
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut next_id: u64 = 1;
    let mut sweep = tokio::time::interval(Duration::from_millis(250));
    let outcome = loop {
        tokio::select! {
            command = end.commands.recv() => {
                let Some(command) = command else { break ConnectionEnd::ControllerGone };
                let Some((line, reply)) = command_line(command, &mut next_id, lines_out) else {
                    continue;
                };
                // Stops and requests must not be dropped: wait for room.
                if lines_out.send(line).await.is_err() {
                    if let Some((_, reply, _)) = reply {
                        reply.fail(DriverError::Unavailable);
                    }
                    break ConnectionEnd::Lost;
                }
                if let Some((id, reply, timeout)) = reply {
                    pending.insert(id, Pending { reply, deadline: Instant::now() + timeout });
                }
            }
            line = lines_in.recv() => {
                let Some(line) = line else { break ConnectionEnd::Lost };
                if let Some(event) = handle_line(&line, &mut pending, lines_out) {
                    if end.events.send(event).await.is_err() {
                        break ConnectionEnd::ControllerGone;
                    }
                }
            }
            _ = sweep.tick() => expire(&mut pending, Instant::now()),
        }
    };
    for (_, p) in pending.drain() {
        p.reply.fail(DriverError::Unavailable);
    }
    outcome
}

/// A command as the line for the driver, and the answer it awaits; `None`
/// for a move, sent (or dropped) here.
fn command_line(
    command: DriverCommand,
    next_id: &mut u64,
    lines_out: &mpsc::Sender<String>,
) -> Option<(String, Option<Awaited>)> {
    let mut take_id = || {
        let id = *next_id;
        *next_id += 1;
        id
    };
    Some(match command {
        DriverCommand::Move { linear, angular } => {
            let line = notification("move", json!({ "linear": linear, "angular": angular }));
            // A full pipe means the driver lags; the next move
            // supersedes this one anyway, so dropping is safe.
            if lines_out.try_send(line).is_err() {
                tracing::warn!("driver input congested; move dropped");
            }
            return None;
        }
        DriverCommand::Stop { reason } => (
            notification("stop", json!({ "reason": reason.as_str() })),
            None,
        ),
        DriverCommand::Navigate {
            name,
            position,
            orientation,
            reply,
        } => {
            let mut params = json!({ "name": name, "position": position });
            if let Some(o) = orientation {
                params["orientation"] = json!(o);
            }
            let id = take_id();
            let awaited = (id, Waiter::Done(reply), REQUEST_TIMEOUT);
            (request(id, "navigate", params), Some(awaited))
        }
        DriverCommand::CancelNavigation { reply } => {
            let id = take_id();
            let awaited = (id, Waiter::Done(reply), REQUEST_TIMEOUT);
            (request(id, "cancel_navigation", json!({})), Some(awaited))
        }
        DriverCommand::CallTool {
            name,
            arguments,
            reply,
        } => {
            let id = take_id();
            let params = json!({ "name": name, "arguments": arguments });
            let awaited = (id, Waiter::Value(reply), super::TOOL_TIMEOUT);
            (request(id, "call_tool", params), Some(awaited))
        }
    })
}

/// Fails the requests whose answer is overdue.
fn expire(pending: &mut HashMap<u64, Pending>, now: Instant) {
    let expired: Vec<u64> = pending
        .iter()
        .filter(|(_, p)| p.deadline <= now)
        .map(|(id, _)| *id)
        .collect();
    for id in expired {
        if let Some(p) = pending.remove(&id) {
            p.reply.fail(DriverError::Timeout);
        }
    }
}

/// Reports the driver down, then waits `delay` before the next attempt while refusing
/// commands, so navigation requests fail at once instead of hanging. `false` when the
/// controller is gone and the driver task should end.
pub async fn wait_out(end: &mut DriverEnd, reason: String, delay: Duration) -> bool {
    if end
        .events
        .send(DriverEvent::Unavailable { reason })
        .await
        .is_err()
    {
        return false;
    }
    let wait = tokio::time::sleep(delay);
    tokio::pin!(wait);
    loop {
        tokio::select! {
            _ = &mut wait => return true,
            command = end.commands.recv() => match command {
                Some(command) => refuse(command),
                None => return false,
            },
        }
    }
}

/// Answers a command that arrived while no driver is connected.
pub fn refuse(command: DriverCommand) {
    match command {
        DriverCommand::Navigate { reply, .. } | DriverCommand::CancelNavigation { reply } => {
            let _ = reply.send(Err(DriverError::Unavailable));
        }
        DriverCommand::CallTool { reply, .. } => {
            let _ = reply.send(Err(DriverError::Unavailable));
        }
        // Nothing to move: the robot is held stopped while no driver runs.
        DriverCommand::Move { .. } | DriverCommand::Stop { .. } => {}
    }
}

fn handle_line(
    line: &str,
    pending: &mut HashMap<u64, Pending>,
    lines_out: &mpsc::Sender<String>,
) -> Option<DriverEvent> {
    let msg: Value = match serde_json::from_str(line) {
        Ok(Value::Object(m)) => Value::Object(m),
        Ok(_) | Err(_) => {
            tracing::warn!(%line, "driver sent something that is not a JSON object");
            return None;
        }
    };
    if let Some(method) = msg.get("method").and_then(Value::as_str) {
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let event = match method {
            "navigation_status" => navigation_status(&params),
            "emergency_stop" => Some(DriverEvent::EmergencyStop {
                reason: params
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("emergency stop")
                    .to_owned(),
            }),
            // A repeated ready (the driver reset itself) changes nothing.
            "ready" => None,
            other => {
                tracing::debug!(method = other, "unknown driver method; ignored");
                if let Some(id) = msg.get("id") {
                    // JSON-RPC: a request for a method we do not have.
                    let answer = json!({
                        "jsonrpc": "2.0",
                        "id": id,
                        "error": { "code": -32601, "message": "method not found" },
                    });
                    let _ = lines_out.try_send(answer.to_string());
                }
                None
            }
        };
        if event.is_none() && method == "navigation_status" {
            tracing::warn!(%line, "malformed navigation_status from driver");
        }
        return event;
    }
    // A response: match it to the request by id.
    let Some(id) = msg.get("id").and_then(Value::as_u64) else {
        tracing::warn!(%line, "driver message has neither method nor numeric id");
        return None;
    };
    let Some(p) = pending.remove(&id) else {
        tracing::debug!(id, "response to no pending request (late or duplicate)");
        return None;
    };
    match msg.get("error") {
        Some(error) => p.reply.fail(DriverError::Refused {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("refused")
                .to_owned(),
        }),
        None => match p.reply {
            Waiter::Done(reply) => {
                let _ = reply.send(Ok(()));
            }
            Waiter::Value(reply) => {
                let _ = reply.send(Ok(msg.get("result").cloned().unwrap_or(Value::Null)));
            }
        },
    }
    None
}

/// The tools of a `ready` notification's `params.tools`; malformed entries
/// are skipped with a warning (a driver cannot break the tool list).
fn declared_tools(params: Option<&Value>) -> Vec<super::DeclaredTool> {
    let Some(list) = params
        .and_then(|p| p.get("tools"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    list.iter()
        .filter_map(|t| {
            let name = text(t, "name").filter(|n| {
                !n.is_empty()
                    && n.len() <= 64
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
            let parameters = t
                .get("parameters")
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            let safety = t.get("safety").cloned().unwrap_or(Value::Null);
            let level = text(&safety, "level").unwrap_or_else(|| "elevated".into());
            let valid = ["normal", "elevated", "critical"].contains(&level.as_str());
            let Some(name) = name.filter(|_| valid) else {
                tracing::warn!(tool = %t, "driver declared a malformed tool; ignored");
                return None;
            };
            Some(super::DeclaredTool {
                description: text(t, "description").unwrap_or_default(),
                parameters,
                requires_confirmation: safety
                    .get("requiresConfirmation")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                reversible: safety
                    .get("reversible")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                safety_description: text(&safety, "description").unwrap_or_default(),
                level,
                name,
            })
        })
        .collect()
}

fn navigation_status(params: &Value) -> Option<DriverEvent> {
    let name = params.get("name")?.as_str()?.to_owned();
    let status: NavigationStatus = serde_json::from_value(params.get("status")?.clone()).ok()?;
    let message = params
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some(DriverEvent::Navigation {
        name,
        status,
        message,
    })
}

fn notification(method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "method": method, "params": params }).to_string()
}

fn request(id: u64, method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DriverHandle;
    use crate::testutil::WAIT;
    use signalling_protocol::Position;
    use tokio::sync::oneshot;

    struct Fixture {
        handle: DriverHandle,
        to_agent: mpsc::Sender<String>,
        from_agent: mpsc::Receiver<String>,
        task: tokio::task::JoinHandle<ConnectionEnd>,
    }

    fn fixture() -> Fixture {
        let (handle, mut end) = DriverHandle::channel();
        let (to_agent, mut lines_in) = mpsc::channel(LINE_CHANNEL);
        let (lines_out, from_agent) = mpsc::channel(LINE_CHANNEL);
        let task = tokio::spawn(async move {
            serve(
                &mut lines_in,
                &lines_out,
                &mut end,
                StopReason::DriverRestarted,
            )
            .await
        });
        Fixture {
            handle,
            to_agent,
            from_agent,
            task,
        }
    }

    async fn next_line(rx: &mut mpsc::Receiver<String>) -> Value {
        let line = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("line in time")
            .expect("line");
        serde_json::from_str(&line).expect("JSON line")
    }

    /// A navigate answered, its status reported, a cancel refused.
    async fn navigation_round_trips(f: &mut Fixture) {
        let (reply, answer) = oneshot::channel();
        f.handle
            .commands
            .send(DriverCommand::Navigate {
                name: "dock".into(),
                position: Position {
                    x: 1.0,
                    y: 2.0,
                    z: None,
                },
                orientation: None,
                reply,
            })
            .await
            .expect("send");
        let nav = next_line(&mut f.from_agent).await;
        assert_eq!(nav["method"], "navigate");
        assert_eq!(
            nav["params"],
            json!({"name":"dock","position":{"x":1.0,"y":2.0}})
        );
        let id = nav["id"].as_u64().expect("id");
        f.to_agent
            .send(json!({"jsonrpc":"2.0","id":id,"result":{}}).to_string())
            .await
            .expect("send");
        assert!(answer.await.expect("reply").is_ok());

        f.to_agent
            .send(r#"{"jsonrpc":"2.0","method":"navigation_status","params":{"name":"dock","status":"completed"}}"#.into())
            .await
            .expect("send");
        assert_eq!(
            f.handle.events.recv().await,
            Some(DriverEvent::Navigation {
                name: "dock".into(),
                status: NavigationStatus::Completed,
                message: None
            })
        );

        let (reply, answer) = oneshot::channel();
        f.handle
            .commands
            .send(DriverCommand::CancelNavigation { reply })
            .await
            .expect("send");
        let cancel = next_line(&mut f.from_agent).await;
        assert_eq!(cancel["method"], "cancel_navigation");
        f.to_agent
            .send(json!({"jsonrpc":"2.0","id":cancel["id"],"error":{"code":1,"message":"nothing to cancel"}}).to_string())
            .await
            .expect("send");
        assert!(matches!(
            answer.await.expect("reply"),
            Err(DriverError::Refused { code: 1, .. })
        ));
    }

    #[tokio::test]
    async fn ready_then_commands_and_responses() {
        let mut f = fixture();
        f.to_agent
            .send(r#"{"jsonrpc":"2.0","method":"ready","params":{}}"#.into())
            .await
            .expect("send");
        // First thing after ready: a stop, so the robot starts at rest.
        let stop = next_line(&mut f.from_agent).await;
        assert_eq!(stop["method"], "stop");
        assert_eq!(stop["params"]["reason"], "driver_restarted");
        assert_eq!(f.handle.events.recv().await, Some(DriverEvent::Ready));

        f.handle
            .commands
            .send(DriverCommand::Move {
                linear: 0.25,
                angular: -0.5,
            })
            .await
            .expect("send");
        let mv = next_line(&mut f.from_agent).await;
        assert_eq!(
            mv,
            json!({"jsonrpc":"2.0","method":"move","params":{"linear":0.25,"angular":-0.5}})
        );

        navigation_round_trips(&mut f).await;

        f.to_agent
            .send(
                r#"{"jsonrpc":"2.0","method":"emergency_stop","params":{"reason":"bumper"}}"#
                    .into(),
            )
            .await
            .expect("send");
        assert_eq!(
            f.handle.events.recv().await,
            Some(DriverEvent::EmergencyStop {
                reason: "bumper".into()
            })
        );

        // Garbage is ignored, an unknown request gets method-not-found.
        f.to_agent.send("not json".into()).await.expect("send");
        f.to_agent
            .send(r#"{"jsonrpc":"2.0","id":"x","method":"frobnicate"}"#.into())
            .await
            .expect("send");
        let err = next_line(&mut f.from_agent).await;
        assert_eq!(err["error"]["code"], -32601);
        assert_eq!(err["id"], "x");

        drop(f.to_agent);
        let end = tokio::time::timeout(WAIT, f.task)
            .await
            .expect("ends")
            .expect("task");
        assert_eq!(end, ConnectionEnd::Lost);
    }

    #[tokio::test]
    async fn requests_before_ready_are_refused() {
        let f = fixture();
        let (reply, answer) = oneshot::channel();
        f.handle
            .commands
            .send(DriverCommand::CancelNavigation { reply })
            .await
            .expect("send");
        assert!(matches!(
            answer.await.expect("reply"),
            Err(DriverError::Unavailable)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_requests_time_out() {
        let mut f = fixture();
        f.to_agent
            .send(r#"{"jsonrpc":"2.0","method":"ready"}"#.into())
            .await
            .expect("send");
        let _stop = next_line(&mut f.from_agent).await;
        let (reply, answer) = oneshot::channel();
        f.handle
            .commands
            .send(DriverCommand::CancelNavigation { reply })
            .await
            .expect("send");
        assert!(matches!(
            answer.await.expect("reply"),
            Err(DriverError::Timeout)
        ));
    }

    #[tokio::test]
    async fn long_lines_are_dropped() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut input = vec![b'a'; MAX_LINE + 10];
        input.extend_from_slice(b"\n{\"ok\":1}\n");
        tokio::spawn(read_lines(std::io::Cursor::new(input), tx));
        assert_eq!(rx.recv().await.as_deref(), Some("{\"ok\":1}"));
        assert_eq!(rx.recv().await, None);
    }
}
