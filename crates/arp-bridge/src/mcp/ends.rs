//! What serving a connection and reconnecting after one share: reading the host's next
//! message, answering a request with why the robot cannot be reached, and initializing the
//! robot on a new connection.

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::robot::{Robot, RobotError};
use super::session::{self, arp_initialize_params};
use crate::config::{Config, Exit};
use crate::intake::{Input, Intake};
use crate::jsonrpc::{self, INTERNAL_ERROR};
use crate::parent::{emit, not_ready, VERSION};
use crate::ws::{FromRobot, Link};

/// The host's next JSON object (framing errors answered meanwhile); else how the bridge
/// ends.
pub(super) async fn next_object(
    intake: &mut Intake,
    out: &mpsc::Sender<String>,
) -> Result<Map<String, Value>, Exit> {
    loop {
        match intake.next().await {
            Input::Object { object, .. } => return Ok(object),
            Input::Refused(error) => emit(out, error).await,
            Input::Blank => {}
            Input::Failed(e) => {
                eprintln!("arp-bridge: reading stdin failed: {e}");
                return Err(Exit::Input);
            }
            Input::Ended => return Err(Exit::Eof),
        }
    }
}

/// Answers `object`, if it is a request, with why the robot cannot be reached (`-32603`,
/// `data.reason`). Whether it was one.
pub(super) async fn answer_with(
    object: &Map<String, Value>,
    out: &mpsc::Sender<String>,
    reason: &str,
    why: &str,
) -> bool {
    let Some(id) = object.get("id").filter(|_| object.contains_key("method")) else {
        return false;
    };
    let message = format!("arp-bridge could not reach the robot ({reason}): {why}");
    let data = json!({ "reason": reason });
    emit(
        out,
        jsonrpc::error(id, INTERNAL_ERROR, &message, Some(data)),
    )
    .await;
    true
}

/// The bridge is the ARP client: it initializes before saying ready,
/// dispatching frames meanwhile so the answer can arrive. The robot's
/// `serverInfo`; else (the parent told why on the ready line) the reason
/// (`data.reason` of the ARP error, or the kind) and the message.
pub(super) async fn initialize_robot(
    config: &Config,
    robot: &Robot,
    link: &mut Link,
    out: &mpsc::Sender<String>,
    elicits: bool,
) -> Result<Value, (String, String)> {
    // Confirmation only for a host that can ask its user: see the comment of mcp/mod.rs.
    let params = arp_initialize_params("arp-bridge", VERSION, elicits);
    let init = session::initialize_robot(robot, params);
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
    let e = match initialized {
        Ok(info) => return Ok(info),
        Err(e) => e,
    };
    let kind = match &e {
        RobotError::Arp(_) => "initialize",
        _ => "connect",
    };
    eprintln!("arp-bridge: arp.initialize failed: {e}");
    let mut ready = not_ready(config, kind, &e.to_string());
    let mut reason = kind.to_owned();
    if let RobotError::Arp(arp) = &e {
        ready["params"]["error"]["arp"] = json!({
            "code": arp.code, "message": arp.message, "data": arp.data,
        });
        if let Some(why) = arp
            .data
            .as_ref()
            .and_then(|d| d.get("reason"))
            .and_then(Value::as_str)
        {
            reason = why.to_owned();
        }
    }
    emit(out, ready).await;
    Err((reason, e.to_string()))
}
