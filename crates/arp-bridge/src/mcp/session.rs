//! One MCP session over one ARP connection, whatever carries either: the stdio bridge
//! (stdin/stdout and a WebSocket, [`super::server`]) and the server's remote endpoint
//! (Streamable HTTP and an in-process gateway session) both run this. MCP messages come
//! in through [`Session::client_object`]; everything for the client (answers, progress,
//! requests) leaves as lines on the `out` channel given at the start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{json, Map, Value};
use signalling_protocol::arp::{method, ARP_VERSION};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinSet;

use super::limits::{ESTOP_TOOL, MAX_IN_FLIGHT, PROTOCOL_VERSIONS, RESOURCE_PREFIX, UPDATES_QUEUE};
use super::prompts;
use super::robot::{refusal, Robot, RobotError};
use super::tools::{
    context_name, resources_list, resources_read, resources_subscribe, tools_call, tools_list,
};
use crate::jsonrpc::{self, Message, RpcError, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::parent::emit;

/// Who serves the session, as `initialize` tells the client.
#[derive(Debug, Clone)]
pub struct Host {
    /// `serverInfo.name`.
    pub name: String,
    pub version: String,
    /// `serverInfo.title`, before the robot's name ("ARP bridge to").
    pub title_prefix: String,
    /// The answer to `arp-bridge.describe`, for a host that serves it.
    pub describe: Option<Value>,
}

/// How an MCP host opens its ARP session: `arp.initialize`'s parameters.
pub fn arp_initialize_params(client: &str, version: &str, confirmation: bool) -> Value {
    json!({
        "protocolVersion": ARP_VERSION,
        "clientInfo": { "name": client, "version": version },
        "capabilities": { "planning": false, "confirmation": confirmation },
    })
}

/// `arp.initialize` on `robot` (its frames must be dispatched meanwhile); the robot's
/// `serverInfo`.
pub async fn initialize_robot(robot: &Robot, params: Value) -> Result<Value, RobotError> {
    let result = robot.request(method::INITIALIZE, params).await?;
    Ok(result.get("serverInfo").cloned().unwrap_or(Value::Null))
}

/// Requests for confirmation that may wait to be put to the client at once.
const CONFIRMATIONS: usize = 16;
/// Bounds on the robot's `timeout` for a confirmation (seconds).
const CONFIRM_DEFAULT: f64 = 30.0;
const CONFIRM_MAX: f64 = 300.0;
/// `confirmedBy` of an answer the client's user gave (a server on the way may set its own:
/// the gateway names the authenticated subject).
pub const CONFIRMED_BY_CLIENT: &str = "MCP client's user (elicitation)";

type Asked = Arc<Mutex<HashMap<String, oneshot::Sender<Result<Value, RpcError>>>>>;

/// A `tools/call` of the client still running, for relating what the session sends
/// meanwhile to it ([`Session::related_request`]).
struct Running {
    id: Value,
    name: String,
    arguments: Value,
}

/// What the session's own messages relate to: the running `tools/call`s, and which of them
/// each `elicitation/create` asks for (by the ask's id key).
#[derive(Default)]
struct Relations {
    calls: Vec<Running>,
    asks: HashMap<String, Value>,
}

impl Relations {
    /// The running call a robot's request for confirmation is for. ARP's request names the
    /// tool and its arguments, not the call: the oldest call of that tool with those
    /// arguments, else of that tool, else the only call running.
    fn call_confirmed(&self, params: &Value) -> Option<Value> {
        let tool = params.pointer("/details/tool").and_then(Value::as_str)?;
        let arguments = params.pointer("/details/arguments");
        let calls = &self.calls;
        let of_tool = move || calls.iter().filter(move |c| c.name == tool);
        of_tool()
            .find(|c| Some(&c.arguments) == arguments)
            .or_else(|| of_tool().next())
            .or(match calls.as_slice() {
                [only] => Some(only),
                _ => None,
            })
            .map(|c| c.id.clone())
    }
}

pub struct Session {
    host: Host,
    robot: Robot,
    out: mpsc::Sender<String>,
    /// The robot's `serverInfo`, for `initialize`.
    robot_info: Value,
    tasks: JoinSet<()>,
    slots: Arc<Semaphore>,
    /// The client said it can ask its user (`capabilities.elicitation`).
    elicits: bool,
    /// The robot's requests for confirmation.
    confirmations: mpsc::Receiver<(Value, Value)>,
    /// Our `elicitation/create` requests waiting for the client's answer, by id.
    asked: Asked,
    next_ask: u64,
    /// Names of subscribed context sources that changed.
    updates: mpsc::Receiver<String>,
    relations: Arc<Mutex<Relations>>,
}

impl Session {
    pub fn new(host: Host, robot: Robot, out: mpsc::Sender<String>, robot_info: Value) -> Session {
        let (confirmer, confirmations) = mpsc::channel(CONFIRMATIONS);
        robot.confirm_through(confirmer);
        let (told, updates) = mpsc::channel(UPDATES_QUEUE);
        robot.tell_updates(told);
        Session {
            host,
            robot,
            out,
            robot_info,
            tasks: JoinSet::new(),
            slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            elicits: false,
            confirmations,
            asked: Arc::default(),
            next_ask: 0,
            updates,
            relations: Arc::default(),
        }
    }

    /// The id of the client's `tools/call` an `elicitation/create` of this session asks
    /// about, while the question is open. A transport that answers each request on a
    /// stream of its own (Streamable HTTP's SSE) sends the question there. (Progress
    /// relates by the token the client gave its request, which such a transport knows.)
    pub fn related_request(&self, message: &Map<String, Value>) -> Option<Value> {
        if message.get("method").and_then(Value::as_str) != Some("elicitation/create") {
            return None;
        }
        let ask = message.get("id")?;
        lock(&self.relations)
            .asks
            .get(&jsonrpc::id_key(ask))
            .cloned()
    }

    pub fn robot(&self) -> &Robot {
        &self.robot
    }

    /// The ARP connection was made again (a new token): requests go to `robot` from now on,
    /// and the client's subscriptions are renewed on it.
    pub fn reconnected(&mut self, robot: Robot) {
        let (confirmer, confirmations) = mpsc::channel(CONFIRMATIONS);
        robot.confirm_through(confirmer);
        let (told, updates) = mpsc::channel(UPDATES_QUEUE);
        robot.tell_updates(told);
        self.confirmations = confirmations;
        self.updates = updates;
        let old = std::mem::replace(&mut self.robot, robot);
        for name in old.subscribed() {
            let robot = self.robot.clone();
            self.tasks.spawn(async move {
                if let Err(e) = robot.subscribe(&name).await {
                    eprintln!("arp-bridge: renewing the subscription to {name} failed: {e}");
                }
            });
        }
    }

    /// One message of the client.
    pub async fn client_object(&mut self, object: Map<String, Value>) {
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
            // The answer to an `elicitation/create`; any other is dropped.
            Message::Response { id, outcome } => {
                let waiter = lock(&self.asked).remove(&jsonrpc::id_key(&id));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(outcome);
                }
            }
            Message::Invalid { id, why } => {
                emit(&self.out, jsonrpc::error(&id, INVALID_REQUEST, &why, None)).await;
            }
        }
    }

    /// The session's own work between messages: a request task ended, or the robot asks
    /// for a confirmation. Never resolves while there is none (for a `select!` that also
    /// reads both sides).
    pub async fn reap(&mut self) {
        tokio::select! {
            Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            Some((id, params)) = self.confirmations.recv() => self.confirm(id, params),
            Some(name) = self.updates.recv() => {
                let uri = format!("{RESOURCE_PREFIX}{name}");
                let updated = json!({ "uri": uri });
                emit(&self.out, jsonrpc::notification("notifications/resources/updated", updated)).await;
            }
            else => std::future::pending::<()>().await,
        }
    }

    /// The robot asks for a person's approval of a call: put to the client's user through
    /// MCP elicitation (accept with `confirm: true` approves; decline, cancel or anything
    /// else refuses), or refused at once for a client that cannot ask. Nobody answering in
    /// time leaves the robot's own timeout to answer the call (-40005).
    fn confirm(&mut self, id: Value, params: Value) {
        let robot = self.robot.clone();
        if !self.elicits {
            self.tasks.spawn(async move {
                let _ = robot.answer(&id, refusal(&params)).await;
            });
            return;
        }
        self.next_ask += 1;
        let ask_id = json!(format!("confirm-{}", self.next_ask));
        let key = jsonrpc::id_key(&ask_id);
        let (tx, rx) = oneshot::channel();
        lock(&self.asked).insert(key.clone(), tx);
        {
            let mut relations = lock(&self.relations);
            if let Some(call) = relations.call_confirmed(&params) {
                relations.asks.insert(key.clone(), call);
            }
        }
        let (out, asked) = (self.out.clone(), self.asked.clone());
        let relations = self.relations.clone();
        self.tasks.spawn(async move {
            let request = jsonrpc::request(&ask_id, "elicitation/create", elicitation(&params));
            emit(&out, request).await;
            let timeout = params
                .get("timeout")
                .and_then(Value::as_f64)
                .filter(|t| t.is_finite() && *t > 0.0)
                .unwrap_or(CONFIRM_DEFAULT)
                .min(CONFIRM_MAX);
            let answer = tokio::time::timeout(Duration::from_secs_f64(timeout), rx).await;
            lock(&asked).remove(&key);
            lock(&relations).asks.remove(&key);
            let confirmed = match answer {
                Ok(Ok(Ok(result))) => accepted(&result),
                // Refused, or the session ended.
                Ok(_) => false,
                Err(_) => return,
            };
            let result = json!({
                "confirmed": confirmed,
                "confirmedBy": CONFIRMED_BY_CLIENT,
                "timestamp": crate::time::now_rfc3339(),
            });
            let _ = robot.answer(&id, result).await;
        });
    }

    pub fn abort_all(&mut self) {
        self.tasks.abort_all();
    }

    /// The ARP connection is gone: every waiting request answers with an error now (two
    /// seconds at most). How many were unanswered.
    pub async fn closed(&mut self) -> usize {
        self.robot.close();
        // Questions to the client are moot now.
        lock(&self.asked).clear();
        let unanswered = self.tasks.len();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
        unanswered
    }

    async fn request(&mut self, id: Value, method: &str, params: Value) {
        let params = match params {
            Value::Object(p) => p,
            _ => {
                let e = jsonrpc::error(&id, INVALID_PARAMS, "params must be an object", None);
                emit(&self.out, e).await;
                return;
            }
        };
        let answer = match method {
            "initialize" => jsonrpc::result(&id, self.initialize(&params)),
            "ping" => jsonrpc::result(&id, json!({})),
            crate::DESCRIBE if self.host.describe.is_some() => {
                jsonrpc::result(&id, self.host.describe.clone().unwrap_or_default())
            }
            "resources/templates/list" => jsonrpc::result(&id, json!({ "resourceTemplates": [] })),
            "resources/unsubscribe" => match context_name(&params) {
                Ok(name) => {
                    self.robot.unsubscribe(name);
                    jsonrpc::result(&id, json!({}))
                }
                Err(e) => e.to_response(&id),
            },
            "prompts/list" => jsonrpc::result(&id, prompts::list()),
            "prompts/get" => match prompts::get(&params) {
                Ok(prompt) => jsonrpc::result(&id, prompt),
                Err(e) => e.to_response(&id),
            },
            "tools/list"
            | "tools/call"
            | "resources/list"
            | "resources/read"
            | "resources/subscribe" => {
                return self.spawn(id, method.to_owned(), params).await;
            }
            _ => jsonrpc::error(
                &id,
                METHOD_NOT_FOUND,
                &format!("method not found: {method}"),
                None,
            ),
        };
        emit(&self.out, answer).await;
    }

    fn initialize(&mut self, params: &Map<String, Value>) -> Value {
        self.elicits = client_elicits(params);
        initialize_result(&self.host, &self.robot_info, params)
    }

    /// Requests that wait on the robot run in tasks of their own, at most
    /// [`MAX_IN_FLIGHT`]: the loop keeps reading both sides meanwhile.
    async fn spawn(&mut self, id: Value, method: String, params: Map<String, Value>) {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let e = jsonrpc::over_limit(&id, "too many requests in flight", MAX_IN_FLIGHT);
            emit(&self.out, e).await;
            return;
        };
        let robot = self.robot.clone();
        let out = self.out.clone();
        let cancel = if method == "tools/call" {
            let (tx, rx) = watch::channel(false);
            robot.router().cancels.insert(jsonrpc::id_key(&id), tx);
            lock(&self.relations).calls.push(Running {
                id: id.clone(),
                name: params
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .into(),
                arguments: params
                    .get("arguments")
                    .cloned()
                    .unwrap_or_else(|| json!({})),
            });
            Some(rx)
        } else {
            None
        };
        let relations = self.relations.clone();
        self.tasks.spawn(async move {
            let _permit = permit;
            let answer = match method.as_str() {
                "tools/list" => tools_list(&robot).await,
                "resources/list" => resources_list(&robot).await,
                "resources/read" => resources_read(&robot, &params).await,
                "resources/subscribe" => resources_subscribe(&robot, &params).await,
                _ => tools_call(&robot, &out, &id, &params, cancel).await,
            };
            robot.router().cancels.remove(&jsonrpc::id_key(&id));
            // The answer is emitted after this: it needs no relation.
            lock(&relations).calls.retain(|c| c.id != id);
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
}

/// Whether an MCP `initialize`'s client declared it can ask its user (elicitation).
pub fn client_elicits(params: &Map<String, Value>) -> bool {
    params
        .get("capabilities")
        .and_then(|c| c.get("elicitation"))
        .is_some_and(|e| !e.is_null())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each update is one insert or remove: nothing half done to protect.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `elicitation/create`'s params for the robot's `arp.requestConfirmation`.
fn elicitation(params: &Value) -> Value {
    let action = params
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or("an action");
    let tool = params
        .pointer("/details/tool")
        .and_then(Value::as_str)
        .unwrap_or("a tool");
    let arguments = params
        .pointer("/details/arguments")
        .map(Value::to_string)
        .unwrap_or_else(|| "{}".into());
    let level = params
        .get("safetyLevel")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    json!({
        "message": format!(
            "The robot asks a person to confirm before it acts: {action} (tool {tool}, \
             arguments {arguments}, safety level {level}). Confirm only if it is safe."
        ),
        "requestedSchema": {
            "type": "object",
            "properties": {
                "confirm": {
                    "type": "boolean",
                    "title": "Confirm",
                    "description": format!("Let the robot run {tool}"),
                },
            },
            "required": ["confirm"],
        },
    })
}

/// An elicitation result that approves: accepted, with `confirm: true`.
fn accepted(result: &Value) -> bool {
    result.get("action").and_then(Value::as_str) == Some("accept")
        && result.pointer("/content/confirm").and_then(Value::as_bool) == Some(true)
}

/// The answer to MCP's `initialize`: the version (the client's if known, else the
/// newest), what is served, who serves it, and how to use a robot.
pub fn initialize_result(host: &Host, robot_info: &Value, params: &Map<String, Value>) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .filter(|v| PROTOCOL_VERSIONS.contains(v))
        .unwrap_or(PROTOCOL_VERSIONS[0]);
    let robot = robot_info
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("robot");
    let kind = robot_info
        .get("robotType")
        .and_then(Value::as_str)
        .unwrap_or("robot");
    json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": { "listChanged": false },
            "resources": { "subscribe": true, "listChanged": false },
            "prompts": { "listChanged": false },
        },
        "serverInfo": {
            "name": host.name,
            "title": format!("{} {robot}", host.title_prefix),
            "version": host.version,
        },
        "instructions": format!(
            "The tools act on a physical robot ({kind}) through the Autonomous Robot \
             Protocol {ARP_VERSION}. Call {ESTOP_TOOL} at once if anything looks unsafe. \
             The robot's state (pose, status) is readable as resources \
             {RESOURCE_PREFIX}{{name}}."
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(id: u64, name: &str, arguments: Value) -> Running {
        Running {
            id: json!(id),
            name: name.into(),
            arguments,
        }
    }

    /// ARP's request for confirmation names a tool and its arguments, not the call: it is
    /// the call with both, else of that tool, else the only one running.
    #[test]
    fn a_confirmation_is_related_to_the_call_it_asks_about() {
        let ask = |tool: &str, arguments: Value| json!({ "action": "x", "details": { "tool": tool, "arguments": arguments } });
        let mut relations = Relations {
            calls: vec![
                running(1, "save_location", json!({ "name": "a" })),
                running(2, "save_location", json!({ "name": "b" })),
                running(3, "drive", json!({})),
            ],
            ..Relations::default()
        };
        let of = |r: &Relations, params: Value| r.call_confirmed(&params);
        assert_eq!(
            of(&relations, ask("save_location", json!({ "name": "b" }))),
            Some(json!(2))
        );
        assert_eq!(
            of(&relations, ask("save_location", json!({ "name": "c" }))),
            Some(json!(1))
        );
        assert_eq!(
            of(&relations, ask("dock", json!({}))),
            None,
            "several calls, none of it"
        );
        relations.calls.truncate(1);
        assert_eq!(of(&relations, ask("dock", json!({}))), Some(json!(1)));
        assert_eq!(
            of(&relations, json!({ "action": "x" })),
            None,
            "no tool named"
        );
    }
}
