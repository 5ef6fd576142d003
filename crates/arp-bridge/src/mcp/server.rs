//! The MCP side: the session's loop (initialize the robot, then serve the
//! parent's lines and the robot's frames), and the parent's requests.

use std::time::Duration;

use serde_json::{json, Value};
use signalling_protocol::arp::{method, MAX_FRAME_BYTES};
use tokio::sync::mpsc;

use super::ends::{answer_with, initialize_robot, next_object};
use super::limits::{PROTOCOL_VERSIONS, START_ERROR_WAIT};
use super::reconnect;
use super::robot::Robot;
use super::session::{self, Host, Session};
use crate::config::{Config, Exit};
use crate::intake::{Input, Intake};
use crate::jsonrpc;
use crate::parent::{emit, ready_params, CLOSED, DESCRIBE, READY, VERSION};
use crate::ws::{self, FromRobot, Link};

pub fn describe(config: &Config) -> Value {
    json!({
        "name": "arp-bridge",
        "version": VERSION,
        "mode": "mcp",
        "url": ws::redact(&config.target.url),
        "methods": [
            "initialize", "ping", "tools/list", "tools/call", "resources/list",
            "resources/read", "resources/templates/list", "prompts/list", "prompts/get",
            DESCRIBE,
        ],
        "notifications": [READY, CLOSED, "notifications/progress"],
        "accepts": ["notifications/initialized", "notifications/cancelled"],
        "protocolVersions": PROTOCOL_VERSIONS,
        "maxFrameBytes": MAX_FRAME_BYTES,
    })
}

pub async fn run(
    config: &Config,
    mut link: Link,
    mut intake: Intake,
    out: &mpsc::Sender<String>,
) -> Exit {
    // The host's first message (its `initialize`) says whether it can ask its user
    // (elicitation), which the ARP session must declare at its own initialize.
    let first = match next_object(&mut intake, out).await {
        Ok(first) => first,
        Err(exit) => {
            link.close().await;
            return exit;
        }
    };
    let elicits = first.get("method").and_then(Value::as_str) == Some("initialize")
        && first
            .get("params")
            .and_then(Value::as_object)
            .is_some_and(session::client_elicits);
    let robot = Robot::new(link.to_robot.clone());
    let robot_info = match initialize_robot(config, &robot, &mut link, out, elicits).await {
        Ok(info) => info,
        Err((reason, why)) => {
            link.close().await;
            if !answer_with(&first, out, &reason, &why).await {
                refuse_start(&mut intake, out, &reason, &why).await;
            }
            return Exit::StartFailed;
        }
    };
    emit(
        out,
        jsonrpc::notification(READY, ready_params(config, json!({ "robot": robot_info }))),
    )
    .await;
    let host = Host {
        name: "arp-bridge".into(),
        version: VERSION.into(),
        title_prefix: "ARP bridge to".into(),
        describe: Some(describe(config)),
    };
    let mut session = Session::new(host, robot, out.clone(), robot_info);
    session.client_object(first).await;
    loop {
        let (code, why, token) = match serve(&mut session, link, &mut intake, out).await {
            Served::Exit(exit) => return exit,
            Served::Lost { code, why, token } => (code, why, token),
        };
        let rejoins = reconnect::token_ended(code);
        closed(&mut session, out, code, &why, rejoins).await;
        if !rejoins {
            return Exit::ConnectionLost;
        }
        let offline = reconnect::Offline::new(config, elicits, token, why);
        link = match offline.serve(&mut session, &mut intake, out).await {
            Ok(link) => link,
            Err(exit) => return exit,
        };
    }
}

/// How serving one connection ended.
enum Served {
    Exit(Exit),
    /// The ARP connection closed under the session.
    Lost {
        code: Option<u16>,
        why: String,
        token: Option<String>,
    },
}

/// Serves the host's lines and the robot's frames over one connection.
async fn serve(
    session: &mut Session,
    mut link: Link,
    intake: &mut Intake,
    out: &mpsc::Sender<String>,
) -> Served {
    let lost = |code, why: &str, link: &Link| Served::Lost {
        code,
        why: why.to_owned(),
        token: link.token().map(str::to_owned),
    };
    loop {
        tokio::select! {
            input = intake.next() => match input {
                Input::Object { object, .. } => session.client_object(object).await,
                Input::Refused(error) => emit(out, error).await,
                Input::Blank => {}
                Input::Failed(e) => {
                    eprintln!("arp-bridge: reading stdin failed: {e}");
                    session.abort_all();
                    link.close().await;
                    return Served::Exit(Exit::Input);
                }
                Input::Ended => {
                    session.abort_all();
                    let robot = session.robot().clone();
                    shut_down(&robot, link).await;
                    return Served::Exit(Exit::Eof);
                }
            },
            frame = link.from_robot.recv() => match frame {
                Some(FromRobot::Frame(text)) => {
                    if let Some(answer) = session.robot().dispatch(&text) {
                        let _ = link.to_robot.send(answer.to_string()).await;
                    }
                }
                Some(FromRobot::Closed { code, reason }) => return lost(code, &reason, &link),
                None => return lost(None, "the connection ended", &link),
            },
            () = session.reap() => {}
        }
    }
}

/// The bridge could not start: an MCP host learns why from the answer to its first
/// request (`-32603`, `data.reason`: `unauthorized`, `connect`, `robot_offline`,
/// `robot_busy`, ...) rather than from a closed pipe. Waits for that request a while.
pub async fn refuse_start(
    intake: &mut Intake,
    out: &mpsc::Sender<String>,
    reason: &str,
    why: &str,
) {
    let answered = async {
        loop {
            match intake.next().await {
                Input::Object { object, .. } => {
                    if answer_with(&object, out, reason, why).await {
                        return;
                    }
                }
                Input::Refused(error) => emit(out, error).await,
                Input::Blank => {}
                Input::Failed(_) | Input::Ended => return,
            }
        }
    };
    let _ = tokio::time::timeout(START_ERROR_WAIT, answered).await;
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

/// The ARP connection closed under the session: the parent learns why, and whether the
/// bridge stays to connect again (`rejoins`: the token ended, a new one may come).
async fn closed(
    session: &mut Session,
    out: &mpsc::Sender<String>,
    code: Option<u16>,
    why: &str,
    rejoins: bool,
) {
    eprintln!("arp-bridge: the ARP connection closed: {why}");
    // Every waiting request task answers its MCP request with an error now.
    let unanswered = session.closed().await;
    let params = json!({
        "reason": why, "code": code, "unanswered": unanswered, "reconnects": rejoins,
    });
    emit(out, jsonrpc::notification(CLOSED, params)).await;
}
