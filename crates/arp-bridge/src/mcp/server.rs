//! The MCP side: the session's loop (initialize the robot, then serve the
//! parent's lines and the robot's frames), and the parent's requests.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use signalling_protocol::arp::{method, ARP_VERSION, MAX_FRAME_BYTES};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use super::limits::{ESTOP_TOOL, MAX_IN_FLIGHT, PROTOCOL_VERSIONS, RESOURCE_PREFIX};
use super::robot::{Robot, RobotError};
use super::tools::{resources_list, resources_read, tools_call, tools_list};
use crate::config::{Config, Exit};
use crate::intake::{Input, Intake};
use crate::jsonrpc::{self, Message, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::parent::{emit, not_ready, ready_params, CLOSED, DESCRIBE, READY, VERSION};
use crate::ws::{self, FromRobot, Link};

pub fn describe(config: &Config) -> Value {
    json!({
        "name": "arp-bridge",
        "version": VERSION,
        "mode": "mcp",
        "url": ws::redact(&config.target.url),
        "methods": [
            "initialize", "ping", "tools/list", "tools/call", "resources/list",
            "resources/read", "resources/templates/list", DESCRIBE,
        ],
        "notifications": [READY, CLOSED, "notifications/progress"],
        "accepts": ["notifications/initialized", "notifications/cancelled"],
        "protocolVersions": PROTOCOL_VERSIONS,
        "maxFrameBytes": MAX_FRAME_BYTES,
    })
}

struct Server<'a> {
    config: &'a Config,
    robot: Robot,
    out: &'a mpsc::Sender<String>,
    /// The robot's `serverInfo`, for `initialize`.
    robot_info: Value,
    tasks: JoinSet<()>,
    slots: Arc<Semaphore>,
}

pub async fn run(
    config: &Config,
    mut link: Link,
    mut intake: Intake,
    out: &mpsc::Sender<String>,
) -> Exit {
    let robot = Robot::new(link.to_robot.clone());
    let Some(robot_info) = initialize_robot(config, &robot, &mut link, out).await else {
        link.close().await;
        return Exit::StartFailed;
    };
    emit(
        out,
        jsonrpc::notification(READY, ready_params(config, json!({ "robot": robot_info }))),
    )
    .await;
    let mut server = Server {
        config,
        robot: robot.clone(),
        out,
        robot_info,
        tasks: JoinSet::new(),
        slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
    };
    loop {
        tokio::select! {
            input = intake.next() => match input {
                Input::Object { object, .. } => server.client_object(object).await,
                Input::Refused(error) => emit(out, error).await,
                Input::Blank => {}
                Input::Failed(e) => {
                    eprintln!("arp-bridge: reading stdin failed: {e}");
                    server.tasks.abort_all();
                    link.close().await;
                    return Exit::Input;
                }
                Input::Ended => {
                    server.tasks.abort_all();
                    shut_down(&robot, link).await;
                    return Exit::Eof;
                }
            },
            frame = link.from_robot.recv() => match frame {
                Some(FromRobot::Frame(text)) => {
                    if let Some(answer) = robot.dispatch(&text) {
                        let _ = link.to_robot.send(answer.to_string()).await;
                    }
                }
                Some(FromRobot::Closed { code, reason }) => {
                    server.closed(code, &reason).await;
                    return Exit::ConnectionLost;
                }
                None => {
                    server.closed(None, "the connection ended").await;
                    return Exit::ConnectionLost;
                }
            },
            Some(_) = server.tasks.join_next(), if !server.tasks.is_empty() => {}
        }
    }
}

/// The bridge is the ARP client: it initializes before saying ready,
/// dispatching frames meanwhile so the answer can arrive. The robot's
/// `serverInfo`; `None` (the parent told why) when it failed.
async fn initialize_robot(
    config: &Config,
    robot: &Robot,
    link: &mut Link,
    out: &mpsc::Sender<String>,
) -> Option<Value> {
    let init = robot.request(
        method::INITIALIZE,
        json!({
            "protocolVersion": ARP_VERSION,
            "clientInfo": { "name": "arp-bridge", "version": VERSION },
            // No planning, and no confirmation: see the module's comment.
            "capabilities": { "planning": false, "confirmation": false },
        }),
    );
    tokio::pin!(init);
    let initialized = loop {
        tokio::select! {
            reply = &mut init => break reply,
            frame = link.from_robot.recv() => match frame {
                Some(FromRobot::Frame(text)) => {
                    if let Some(answer) = robot.dispatch(&text) {
                        let _ = link.to_robot.send(answer.to_string()).await;
                    }
                }
                Some(FromRobot::Closed { .. }) | None => {
                    robot.close();
                }
            },
        }
    };
    match initialized {
        Ok(result) => Some(result.get("serverInfo").cloned().unwrap_or(Value::Null)),
        Err(e) => {
            let kind = match &e {
                RobotError::Arp(_) => "initialize",
                _ => "connect",
            };
            eprintln!("arp-bridge: arp.initialize failed: {e}");
            let mut ready = not_ready(config, kind, &e.to_string());
            if let RobotError::Arp(arp) = &e {
                ready["params"]["error"]["arp"] = json!({
                    "code": arp.code, "message": arp.message, "data": arp.data,
                });
            }
            emit(out, ready).await;
            None
        }
    }
}

/// The parent is gone: end the ARP session politely, briefly, then close.
async fn shut_down(robot: &Robot, mut link: Link) {
    let shutdown = robot.request(method::SHUTDOWN, json!({}));
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                frame = link.from_robot.recv() => match frame {
                    Some(FromRobot::Frame(text)) => { robot.dispatch(&text); }
                    _ => break,
                },
            }
        }
    })
    .await;
    link.close().await;
}

impl Server<'_> {
    async fn client_object(&mut self, object: Map<String, Value>) {
        match Message::from_object(object) {
            Message::Request { id, method, params } => self.request(id, &method, params).await,
            Message::Notification { method, params } => {
                if method == "notifications/cancelled" {
                    if let Some(id) = params.get("requestId") {
                        let cancel = self.robot.router().cancels.remove(&jsonrpc::id_key(id));
                        if let Some(cancel) = cancel {
                            cancel.send_replace(true);
                        }
                    }
                }
                // notifications/initialized and the rest need nothing.
            }
            // The bridge sends no requests to the client.
            Message::Response { .. } => {}
            Message::Invalid { id, why } => {
                emit(self.out, jsonrpc::error(&id, INVALID_REQUEST, &why, None)).await;
            }
        }
    }

    async fn request(&mut self, id: Value, method: &str, params: Value) {
        let params = match params {
            Value::Object(p) => p,
            _ => {
                let e = jsonrpc::error(&id, INVALID_PARAMS, "params must be an object", None);
                emit(self.out, e).await;
                return;
            }
        };
        let answer = match method {
            "initialize" => jsonrpc::result(&id, self.initialize(&params)),
            "ping" => jsonrpc::result(&id, json!({})),
            DESCRIBE => jsonrpc::result(&id, describe(self.config)),
            "resources/templates/list" => jsonrpc::result(&id, json!({ "resourceTemplates": [] })),
            "tools/list" | "tools/call" | "resources/list" | "resources/read" => {
                return self.spawn(id, method.to_owned(), params).await;
            }
            _ => jsonrpc::error(
                &id,
                METHOD_NOT_FOUND,
                &format!("method not found: {method}"),
                None,
            ),
        };
        emit(self.out, answer).await;
    }

    fn initialize(&self, params: &Map<String, Value>) -> Value {
        let asked = params.get("protocolVersion").and_then(Value::as_str);
        let version = asked
            .filter(|v| PROTOCOL_VERSIONS.contains(v))
            .unwrap_or(PROTOCOL_VERSIONS[0]);
        let robot = self
            .robot_info
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("robot");
        let kind = self
            .robot_info
            .get("robotType")
            .and_then(Value::as_str)
            .unwrap_or("robot");
        json!({
            "protocolVersion": version,
            "capabilities": {
                "tools": { "listChanged": false },
                "resources": { "subscribe": false, "listChanged": false },
            },
            "serverInfo": {
                "name": "arp-bridge",
                "title": format!("ARP bridge to {robot}"),
                "version": VERSION,
            },
            "instructions": format!(
                "The tools act on a physical robot ({kind}) through the Autonomous Robot \
                 Protocol {ARP_VERSION}. Call {ESTOP_TOOL} at once if anything looks unsafe. \
                 The robot's state (pose, status) is readable as resources \
                 {RESOURCE_PREFIX}{{name}}."
            ),
        })
    }

    /// Requests that wait on the robot run in tasks of their own, at most
    /// [`MAX_IN_FLIGHT`]: the loop keeps reading both sides meanwhile.
    async fn spawn(&mut self, id: Value, method: String, params: Map<String, Value>) {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let e = jsonrpc::over_limit(&id, "too many requests in flight", MAX_IN_FLIGHT);
            emit(self.out, e).await;
            return;
        };
        let robot = self.robot.clone();
        let out = self.out.clone();
        let cancel = if method == "tools/call" {
            let (tx, rx) = watch::channel(false);
            robot.router().cancels.insert(jsonrpc::id_key(&id), tx);
            Some(rx)
        } else {
            None
        };
        self.tasks.spawn(async move {
            let _permit = permit;
            let answer = match method.as_str() {
                "tools/list" => tools_list(&robot).await,
                "resources/list" => resources_list(&robot).await,
                "resources/read" => resources_read(&robot, &params).await,
                _ => tools_call(&robot, &out, &id, &params, cancel).await,
            };
            robot.router().cancels.remove(&jsonrpc::id_key(&id));
            // `None`: cancelled, and MCP wants no answer then.
            if let Some(answer) = answer {
                let message = match answer {
                    Ok(result) => jsonrpc::result(&id, result),
                    Err(e) => e.to_response(&id),
                };
                emit(&out, message).await;
            }
        });
    }

    async fn closed(&mut self, code: Option<u16>, why: &str) {
        eprintln!("arp-bridge: the ARP connection closed: {why}");
        // Every waiting request task answers its MCP request with an
        // error now; give them a moment to print it.
        self.robot.close();
        let unanswered = self.tasks.len();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
        let params = json!({ "reason": why, "code": code, "unanswered": unanswered });
        emit(self.out, jsonrpc::notification(CLOSED, params)).await;
    }
}
