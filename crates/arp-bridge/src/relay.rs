//! `--mode arp`: a transparent relay. Each stdin line that is one JSON
//! object goes to the socket as is; each frame from the robot goes to
//! stdout as one line. Requests both ways (including the robot's
//! `arp.requestConfirmation` and the parent's answer) pass untouched; the
//! bridge only remembers which of the parent's requests are unanswered, so
//! that it can answer them with an error if the connection goes away.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use signalling_protocol::arp::{method, reason, MAX_FRAME_BYTES};
use tokio::sync::mpsc;

use crate::config::{Config, Exit};
use crate::intake::{Input, Intake};
use crate::jsonrpc::{self, Message, INTERNAL_ERROR};
use crate::parent::{emit, ready_params, CLOSED, DESCRIBE, READY, VERSION};
use crate::ws::{self, FromRobot, Link};

/// Unanswered requests remembered at most; beyond, new ones are refused
/// (a robot that never answers must not grow our memory).
pub const MAX_PENDING: usize = 1024;

/// Methods the parent may send through the relay.
const CLIENT_METHODS: &[&str] = &[
    method::INITIALIZE,
    method::SHUTDOWN,
    method::EMERGENCY_STOP,
    method::LIST_TOOLS,
    method::CALL_TOOL,
    method::CANCEL_TOOL,
    method::LIST_CONTEXT,
    method::SUBSCRIBE_CONTEXT,
    method::UNSUBSCRIBE_CONTEXT,
    method::LIST_CONSTRAINTS,
    method::GET_CONSTRAINT,
    method::SET_WORKSPACE,
];

pub fn describe(config: &Config) -> Value {
    let mut methods = vec![DESCRIBE];
    methods.extend_from_slice(CLIENT_METHODS);
    json!({
        "name": "arp-bridge",
        "version": VERSION,
        "mode": "arp",
        "url": ws::redact(&config.target.url),
        "methods": methods,
        "notifications": [
            READY, CLOSED, method::TOOL_PROGRESS, method::CONTEXT_UPDATE, method::EMERGENCY_STOP,
        ],
        "requestsToClient": [method::REQUEST_CONFIRMATION],
        "maxFrameBytes": MAX_FRAME_BYTES,
    })
}

struct Relay<'a> {
    config: &'a Config,
    out: &'a mpsc::Sender<String>,
    to_robot: mpsc::Sender<String>,
    /// The parent's unanswered requests: id key → id.
    pending: HashMap<String, Value>,
}

pub async fn run(
    config: &Config,
    mut link: Link,
    mut intake: Intake,
    out: &mpsc::Sender<String>,
) -> Exit {
    emit(
        out,
        jsonrpc::notification(READY, ready_params(config, json!({}))),
    )
    .await;
    let mut relay = Relay {
        config,
        out,
        to_robot: link.to_robot.clone(),
        pending: HashMap::new(),
    };
    loop {
        tokio::select! {
            input = intake.next() => match input {
                Input::Object { text, object } => relay.parent_object(text, object).await,
                Input::Refused(error) => emit(out, error).await,
                Input::Blank => {}
                Input::Failed(e) => {
                    eprintln!("arp-bridge: reading stdin failed: {e}");
                    link.close().await;
                    return Exit::Input;
                }
                Input::Ended => {
                    link.close().await;
                    return Exit::Eof;
                }
            },
            frame = link.from_robot.recv() => match frame {
                Some(FromRobot::Frame(text)) => relay.robot_frame(&text).await,
                Some(FromRobot::Closed { code, reason }) => {
                    relay.closed(code, &reason).await;
                    return Exit::ConnectionLost;
                }
                None => {
                    relay.closed(None, "the connection ended").await;
                    return Exit::ConnectionLost;
                }
            },
        }
    }
}

impl Relay<'_> {
    async fn parent_object(&mut self, text: String, object: Map<String, Value>) {
        // The robot checks the rest of JSON-RPC; the relay only needs to
        // know the requests it may have to answer itself.
        if let Message::Request { id, method, .. } = Message::from_object(object) {
            if method == DESCRIBE {
                emit(self.out, jsonrpc::result(&id, describe(self.config))).await;
                return;
            }
            let key = jsonrpc::id_key(&id);
            if !self.pending.contains_key(&key) && self.pending.len() >= MAX_PENDING {
                let what = "too many requests awaiting the robot's answer";
                let e = jsonrpc::over_limit(&id, what, MAX_PENDING);
                emit(self.out, e).await;
                return;
            }
            self.pending.insert(key, id);
        }
        // A failed send means the socket is gone: the reader reports the
        // close next, and the request, still pending, is answered then.
        let _ = self.to_robot.send(text).await;
    }

    async fn robot_frame(&mut self, text: &str) {
        let object = match jsonrpc::parse_object(text) {
            Ok(object) => object,
            Err(e) => {
                // stdout carries JSON only: a broken frame is reported aside.
                eprintln!("arp-bridge: dropped a frame from the robot: {e}");
                return;
            }
        };
        if !object.contains_key("method") {
            if let Some(id) = object.get("id") {
                self.pending.remove(&jsonrpc::id_key(id));
            }
        }
        // One message per line: a frame with raw line breaks (pretty
        // printed) is written compactly, anything else byte for byte.
        let line = if text.contains(['\n', '\r']) {
            Value::Object(object).to_string()
        } else {
            text.to_owned()
        };
        let _ = self.out.send(line).await;
    }

    async fn closed(&mut self, code: Option<u16>, why: &str) {
        eprintln!("arp-bridge: the ARP connection closed: {why}");
        let close = json!({ "code": code, "reason": why });
        let mut pending: Vec<Value> = self.pending.drain().map(|(_, id)| id).collect();
        pending.sort_by_key(|id| id.to_string());
        for id in &pending {
            let e = jsonrpc::error(
                id,
                INTERNAL_ERROR,
                "the ARP connection closed before an answer",
                Some(json!({ "reason": reason::ROBOT_OFFLINE, "close": close })),
            );
            emit(self.out, e).await;
        }
        let params = json!({ "reason": why, "code": code, "unanswered": pending.len() });
        emit(self.out, jsonrpc::notification(CLOSED, params)).await;
    }
}
