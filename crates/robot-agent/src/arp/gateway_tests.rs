//! The gateway's ARP sessions end to end: a scripted signalling server on
//! 127.0.0.1:0 logs the agent in (signalling client, peer manager, ARP
//! server, sim driver, all real) and speaks `arp.frame` to it. Every ARP
//! frame the robot sends is validated against the ARP schema, every other
//! message against the spec.

use std::collections::{HashMap, VecDeque};

use futures_util::SinkExt;
use serde_json::{json, Value};
use signalling_protocol::arp::{ArpFramePayload, FRAME_TYPE};
use signalling_protocol::arp_schema::ArpValidator;
use signalling_protocol::schema::SchemaValidator;
use tokio_tungstenite::tungstenite::Message;

use super::*;
use crate::arp::ArpOptions;
use crate::testutil::arp::{fixture, until, Fixture};
use crate::testutil::scripted::{self, envelope, next_text};
use crate::testutil::WAIT;

/// Who a frame comes from, as the server stamps it (`None`: no `meta`).
type Who<'a> = Option<(&'a str, &'a str)>;
const OPERATOR: Who = Some(("planner-7", "operator"));
const VIEWER: Who = Some(("watcher-1", "viewer"));

/// The agent behind a scripted server, and the server's side of the socket.
struct Rig {
    f: Fixture,
    agent: scripted::Agent,
    /// Method of each request sent, by (connectionId, id).
    methods: HashMap<(String, String), String>,
    /// Frames and messages read while waiting for another one.
    backlog: VecDeque<Value>,
    next: u64,
}

fn id_key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

async fn rig() -> Rig {
    rig_with(ArpOptions::default()).await
}

async fn rig_with(options: ArpOptions) -> Rig {
    let f = fixture(options).await;
    let agent = scripted::agent("robot-1", f.server.shared().clone(), f.server.clone(), None).await;
    assert_eq!(agent.register["payload"]["metadata"]["arp"], "0.1.0");
    Rig {
        f,
        agent,
        methods: HashMap::new(),
        backlog: VecDeque::new(),
        next: 1,
    }
}

impl Rig {
    async fn send_raw(&mut self, text: String) {
        self.agent.ws.send(Message::text(text)).await.expect("send");
    }

    /// One `arp.frame` as the server sends it.
    async fn frame(&mut self, connection: &str, who: Who<'_>, frame: Value) {
        let mut message = envelope(
            FRAME_TYPE,
            json!({"connectionId": connection, "frame": frame}),
        );
        if let Some((subject, role)) = who {
            message["meta"] = json!({"session": {"subject": subject, "role": role}});
        }
        self.send_raw(message.to_string()).await;
    }

    async fn request(
        &mut self,
        connection: &str,
        who: Who<'_>,
        method: &str,
        params: Value,
    ) -> Value {
        let id = json!(format!("t{}", self.next));
        self.next += 1;
        self.methods
            .insert((connection.to_owned(), id_key(&id)), method.to_owned());
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        ArpValidator::shared()
            .validate(&frame, None)
            .unwrap_or_else(|e| panic!("the test sends an invalid ARP message: {e}"));
        self.frame(connection, who, frame).await;
        id
    }

    async fn call(&mut self, connection: &str, who: Who<'_>, method: &str, params: Value) -> Value {
        let id = self.request(connection, who, method, params).await;
        self.response(connection, &id).await
    }

    async fn initialize(&mut self, connection: &str, who: Who<'_>) -> Value {
        let params = json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "gateway-test", "version": "1"}});
        let v = self.call(connection, who, "arp.initialize", params).await;
        assert!(v.get("error").is_none(), "initialize failed: {v}");
        v["result"].clone()
    }

    /// The agent's next message; an `arp.frame` is checked (no `meta`, a
    /// valid ARP frame) and kept as `{connectionId, frame}`.
    async fn read(&mut self) -> Value {
        let value = next_text(&mut self.agent.ws).await;
        if value["type"] != FRAME_TYPE {
            return value;
        }
        let asks = value["payload"]["frame"]["method"] == "arp.requestConfirmation";
        let policy = value["meta"]["confirmationPolicy"].clone();
        if asks {
            // The one meta a robot's frame carries here: who may answer a confirmation.
            assert_eq!(
                value["meta"].as_object().map(|m| m.len()),
                Some(1),
                "{value}"
            );
        } else {
            assert!(
                value.get("meta").is_none(),
                "the robot's frames carry no meta: {value}"
            );
        }
        let parsed = Envelope::parse(&value.to_string()).expect("a valid envelope");
        let p = ArpFramePayload::from_envelope(&parsed).expect("an arp.frame payload");
        let answered = p
            .frame
            .get("id")
            .filter(|_| p.frame.get("method").is_none())
            .and_then(|id| self.methods.get(&(p.connection_id.clone(), id_key(id))));
        if let Err(e) = ArpValidator::shared().validate(&p.frame, answered.map(String::as_str)) {
            panic!("the robot sent an invalid ARP frame: {e}\n{}", p.frame);
        }
        let mut kept =
            json!({"type": FRAME_TYPE, "connectionId": p.connection_id, "frame": p.frame});
        if asks {
            kept["confirmationPolicy"] = policy;
        }
        kept
    }

    /// The first message (backlog first) that `matches`; others are kept.
    async fn wait_for(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&matches) {
            return self.backlog.remove(i).expect("present");
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            let v = self.read().await;
            if matches(&v) {
                return v;
            }
            self.backlog.push_back(v);
        }
    }

    async fn response(&mut self, connection: &str, id: &Value) -> Value {
        let what = format!("the answer to {id} on {connection}");
        self.wait_for(&what, |v| {
            v["connectionId"] == connection
                && v["frame"].get("method").is_none()
                && &v["frame"]["id"] == id
        })
        .await["frame"]
            .clone()
    }

    async fn message(&mut self, connection: &str, method: &str) -> Value {
        let what = format!("{method} on {connection}");
        self.wait_for(&what, |v| {
            v["connectionId"] == connection && v["frame"]["method"] == method
        })
        .await["frame"]
            .clone()
    }

    async fn signal(&mut self, kind: &str, connection: &str) -> Value {
        let what = format!("{kind} for {connection}");
        self.wait_for(&what, |v| {
            v["type"] == kind && v["payload"]["connectionId"] == connection
        })
        .await
    }

    async fn disconnect(&mut self, connection: &str) {
        let message = envelope(
            "signalling.disconnected",
            json!({"connectionId": connection, "reason": "closed"}),
        );
        self.send_raw(message.to_string()).await;
    }

    /// Whatever the backlog holds for `connection` (answers and
    /// notifications that came while waiting for something else).
    fn backlog_of(&self, connection: &str) -> Vec<Value> {
        self.backlog
            .iter()
            .filter(|v| v["connectionId"] == connection)
            .map(|v| v["frame"].clone())
            .collect()
    }
}

fn drive(linear: f64, secs: f64) -> Value {
    json!({"name": "drive", "arguments": {"linear": linear, "angular": 0.0, "durationSecs": secs}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_session_initializes_lists_and_drives() {
    let mut r = rig().await;
    let c = "arp-op-1";
    let early = r.call(c, OPERATOR, "arp.listTools", json!({})).await;
    assert_eq!(code(&early), -40009, "initialize comes first");
    let init = r.initialize(c, OPERATOR).await;
    assert_eq!(init["protocolVersion"], "0.1.0");
    let tools = r.call(c, OPERATOR, "arp.listTools", json!({})).await;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"drive") && names.contains(&"stop"),
        "{names:?}"
    );
    let id = r
        .request(c, OPERATOR, "arp.callTool", drive(0.25, 0.5))
        .await;
    let first = r.message(c, "arp.toolProgress").await;
    assert_eq!(first["params"]["progress"], 0.0);
    let done = r.response(c, &id).await;
    assert_eq!(done["result"]["state"], "completed", "{done}");
    assert_eq!(done["result"]["callId"], first["params"]["callId"]);
    until(&r.f.probe, "stopped after the drive", |s| s.linear == 0.0).await;
    let x = r.f.probe.state().x;
    assert!(x > 0.05, "the sim moved: x = {x}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_and_a_viewer_side_by_side_each_get_their_own_answers() {
    let mut r = rig().await;
    let (op, view, anon) = ("arp-op", "arp-view", "arp-anon");
    r.initialize(op, OPERATOR).await;
    r.initialize(view, VIEWER).await;
    // The same request id on both sessions: each answer goes to its own.
    let shared_id = json!("same");
    for (c, who) in [(op, OPERATOR), (view, VIEWER)] {
        r.methods
            .insert((c.to_owned(), "same".into()), "arp.listConstraints".into());
        let frame = json!({"jsonrpc": "2.0", "id": shared_id, "method": "arp.listConstraints"});
        r.frame(c, who, frame).await;
    }
    for c in [op, view] {
        let answer = r.response(c, &shared_id).await;
        assert!(answer["result"]["constraints"].is_array(), "{answer}");
    }
    // The robot's own rules refuse a viewer's drive; the operator's runs.
    let refused = r.call(view, VIEWER, "arp.callTool", drive(0.2, 0.3)).await;
    assert_eq!(code(&refused), -40001);
    assert_eq!(refused["error"]["data"]["reason"], "forbidden");
    let driven = r.call(op, OPERATOR, "arp.callTool", drive(0.2, 0.3)).await;
    assert_eq!(driven["result"]["state"], "completed", "{driven}");
    // No meta at all: a viewer (fail closed), whatever the frame says.
    r.initialize(anon, None).await;
    let id = json!("forged");
    r.methods
        .insert((anon.to_owned(), "forged".into()), "arp.callTool".into());
    let frame = json!({"jsonrpc": "2.0", "id": id, "method": "arp.callTool", "params": drive(0.2, 0.3), "role": "owner"});
    r.frame(anon, None, frame).await;
    let answer = r.response(anon, &id).await;
    assert_eq!(code(&answer), -40001, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_disconnected_mid_drive_stops_the_robot_and_ends_the_session() {
    let mut r = rig().await;
    let c = "arp-drive";
    r.initialize(c, OPERATOR).await;
    let id = r
        .request(c, OPERATOR, "arp.callTool", drive(0.3, 30.0))
        .await;
    r.message(c, "arp.toolProgress").await;
    until(&r.f.probe, "moving", |s| s.linear > 0.0).await;
    // While it holds control, another operator session is busy.
    let busy = r
        .call(
            "arp-other",
            OPERATOR,
            "arp.initialize",
            json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "t", "version": "1"}}),
        )
        .await;
    assert_eq!(code(&busy), -40004);
    assert_eq!(busy["error"]["data"]["reason"], "robot_busy");
    r.disconnect(c).await;
    until(&r.f.probe, "stopped", |s| s.linear == 0.0).await;
    // Stopped by the end of the session (its call cancelled, the
    // controller told), not by the 30 s drive running out.
    assert!(WAIT < std::time::Duration::from_secs(30));
    // The same id now opens a fresh connection (not initialized), and
    // control is free again.
    let fresh = r.call(c, OPERATOR, "arp.listTools", json!({})).await;
    assert_eq!(code(&fresh), -40009);
    r.initialize("arp-other-2", OPERATOR).await;
    // The cancelled drive was never answered after the end: nothing more
    // came for it before the fresh connection's answer.
    let stale: Vec<Value> = r
        .backlog_of(c)
        .into_iter()
        .filter(|f| f["id"] == id)
        .collect();
    assert!(stale.is_empty(), "frames after the end: {stale:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_signalling_socket_ends_every_gateway_session() {
    let mut r = rig().await;
    let c = "arp-lost";
    r.initialize(c, OPERATOR).await;
    r.initialize("arp-lost-viewer", VIEWER).await;
    r.request(c, OPERATOR, "arp.callTool", drive(0.3, 30.0))
        .await;
    r.message(c, "arp.toolProgress").await;
    until(&r.f.probe, "moving", |s| s.linear > 0.0).await;
    // The socket drops; the agent notices, stops, and comes back.
    r.agent.ws.close(None).await.expect("close");
    until(&r.f.probe, "stopped", |s| s.linear == 0.0).await;
    assert!(
        WAIT < std::time::Duration::from_secs(30),
        "not the drive's end"
    );
    r.agent.ws = scripted::accept_login(&r.agent.listener, "robot-1").await.0;
    r.backlog.clear();
    // Both sessions are gone: their ids open fresh connections, and
    // control is free.
    let fresh = r.call(c, OPERATOR, "arp.listTools", json!({})).await;
    assert_eq!(code(&fresh), -40009);
    let fresh = r
        .call("arp-lost-viewer", VIEWER, "arp.listTools", json!({}))
        .await;
    assert_eq!(code(&fresh), -40009);
    r.initialize("arp-after", OPERATOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_role_changes_and_too_many_sessions_are_refused_and_the_agent_serves_on() {
    let mut r = rig().await;
    // Not JSON, not an envelope, no payload, frames that are not objects,
    // no connectionId: each ignored, nothing answers, nothing breaks.
    r.send_raw("not json".into()).await;
    r.send_raw(json!({"type": FRAME_TYPE}).to_string()).await;
    r.send_raw(envelope(FRAME_TYPE, json!({})).to_string())
        .await;
    for frame in [json!([1, 2]), json!("x"), json!(null), json!(7)] {
        let message = envelope(
            FRAME_TYPE,
            json!({"connectionId": "arp-junk", "frame": frame}),
        );
        r.send_raw(message.to_string()).await;
    }
    let no_id = envelope(
        FRAME_TYPE,
        json!({"frame": {"jsonrpc": "2.0", "id": 1, "method": "arp.listTools"}}),
    );
    r.send_raw(no_id.to_string()).await;
    // A frame the ARP handler cannot read is its to answer.
    r.frame("arp-junk", VIEWER, json!({"jsonrpc": "1.0"})).await;
    let answer = r
        .wait_for("the handler's answer", |v| v["connectionId"] == "arp-junk")
        .await;
    assert_eq!(code(&answer["frame"]), -32600);
    // The role may not change during a session; the refusal is the
    // gateway's, the session serves on with its own role.
    let c = "arp-role";
    r.initialize(c, VIEWER).await;
    let changed = r.call(c, OPERATOR, "arp.callTool", drive(0.2, 0.3)).await;
    assert_eq!(code(&changed), -32603);
    assert_eq!(changed["error"]["data"]["reason"], "role_changed");
    let missing = r.call(c, None, "arp.listTools", json!({})).await;
    assert!(
        missing.get("result").is_some(),
        "no meta is a viewer, as opened: {missing}"
    );
    let c2 = "arp-role-op";
    r.initialize(c2, OPERATOR).await;
    let lowered = r.call(c2, None, "arp.listTools", json!({})).await;
    assert_eq!(lowered["error"]["data"]["reason"], "role_changed");
    assert_eq!(r.f.probe.state().linear, 0.0);
    // 16 sessions at once at most (3 are open: arp-junk, arp-role, arp-role-op).
    for n in 3..MAX_CONNECTIONS {
        r.initialize(&format!("arp-many-{n}"), VIEWER).await;
    }
    let over = r.call("arp-over", VIEWER, "arp.listTools", json!({})).await;
    assert_eq!(code(&over), -32603);
    assert_eq!(over["error"]["data"]["reason"], "too_many_sessions");
    let gone = r.signal("signalling.disconnected", "arp-over").await;
    assert_eq!(gone["payload"]["reason"], "failed");
    assert_eq!(gone["payload"]["details"]["reason"], "too_many_sessions");
    // One ends: there is room again.
    r.disconnect("arp-many-3").await;
    r.initialize("arp-over", VIEWER).await;
}

/// A connection whose handler ends on the robot's side is reported to the
/// server as `disconnected` (`closed`), after whatever it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_on_the_robots_side_is_reported_as_closed() {
    let f = fixture(ArpOptions::default()).await;
    let (tx, mut rx) = mpsc::channel(64);
    let mut gateway = Gateway::new(f.server.clone(), tx);
    let frame = json!({"jsonrpc": "2.0", "id": 1, "method": "arp.listTools"});
    gateway.frame("arp-1".into(), frame, None, None);
    let answer = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("in time")
        .expect("open");
    assert_eq!(answer.kind, FRAME_TYPE);
    assert_eq!(gateway.len(), 1);
    // The handler ends (as it would on a failure).
    gateway
        .connections
        .get("arp-1")
        .expect("live")
        .handler
        .abort();
    let ended = tokio::time::timeout(WAIT, gateway.next_ended())
        .await
        .expect("reported in time");
    gateway.ended(ended.clone());
    assert!(gateway.is_empty());
    let end = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("in time")
        .expect("open");
    let value: Value = serde_json::from_str(&end.to_json()).expect("json");
    SchemaValidator::shared().validate(&value).expect("spec");
    assert_eq!(value["type"], "signalling.disconnected");
    assert_eq!(value["payload"]["connectionId"], "arp-1");
    assert_eq!(value["payload"]["reason"], "closed");
    // A second report of the same end, or the server's own disconnected
    // after it, changes nothing and sends nothing.
    gateway.ended(ended);
    assert!(!gateway.disconnected("arp-1"));
    assert!(rx.try_recv().is_err());
}

#[test]
fn an_answer_over_the_servers_frame_cap_becomes_an_error() {
    let big = "x".repeat(MAX_ENVELOPE_BYTES);
    let answer = json!({"jsonrpc": "2.0", "id": 4, "result": {"blob": big}});
    let len = answer.to_string().len();
    let sent = fitted("arp-1", answer, len, None).expect("an error instead");
    let text = sent.to_json();
    assert!(text.len() <= MAX_ENVELOPE_BYTES);
    let frame = &sent.payload.as_ref().expect("payload")["frame"];
    assert_eq!(frame["id"], 4);
    assert_eq!(frame["error"]["code"], -32603);
    assert_eq!(frame["error"]["data"]["reason"], "frame_too_large");
    ArpValidator::shared().validate(frame, None).expect("valid");
    let note = json!({"jsonrpc": "2.0", "method": "arp.contextUpdate", "params": {"blob": big}});
    let len = note.to_string().len();
    assert!(
        fitted("arp-1", note, len, None).is_none(),
        "a notification is dropped"
    );
    let small = json!({"jsonrpc": "2.0", "id": 5, "result": {}});
    assert_eq!(
        fitted("arp-1", small.clone(), 40, None)
            .expect("fits")
            .payload
            .expect("payload")["frame"],
        small
    );
}

/// An e-stop is never lost to a session's end right behind it: the API's stop is a
/// notification in a session of its own followed at once by that session's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emergency_stop_right_before_its_sessions_end_still_stops_the_robot() {
    let mut r = rig().await;
    let c = "arp-drive";
    r.initialize(c, OPERATOR).await;
    r.request(c, OPERATOR, "arp.callTool", drive(0.3, 30.0))
        .await;
    r.message(c, "arp.toolProgress").await;
    until(&r.f.probe, "moving", |s| s.linear > 0.0).await;
    // Both in one write, as the server's queue sends them: the end arrives with the stop.
    let mut stop = envelope(
        FRAME_TYPE,
        json!({"connectionId": "estop-1", "frame": {
            "jsonrpc": "2.0", "method": "arp.emergencyStop", "params": { "reason": "from the API" } }}),
    );
    stop["meta"] = json!({"session": {"subject": "olivia", "role": "owner"}});
    let end = envelope(
        "signalling.disconnected",
        json!({"connectionId": "estop-1", "reason": "closed"}),
    );
    r.agent
        .ws
        .feed(Message::text(stop.to_string()))
        .await
        .expect("feed");
    r.agent
        .ws
        .feed(Message::text(end.to_string()))
        .await
        .expect("feed");
    r.agent.ws.flush().await.expect("flush");
    until(&r.f.probe, "e-stopped", |s| {
        s.linear == 0.0 && s.last_stop.as_deref() == Some("emergency_stop")
    })
    .await;
}

/// A confirmation through the gateway says the robot's policy to the server
/// (`meta.confirmationPolicy`), under an id nobody can guess; the answer the server relays
/// (confirmer named by the server) lets the call run, and the robot logs that confirmer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_through_the_gateway_carries_the_policy_under_an_unguessable_id() {
    for policy in [ConfirmationPolicy::Console, ConfirmationPolicy::Client] {
        let mut r = rig_with(ArpOptions {
            confirm: HashMap::from([("drive".to_owned(), true)]),
            confirmation_policy: policy,
            ..ArpOptions::default()
        })
        .await;
        let c = "arp-op-confirm";
        // What the server's gateway sends: it declares confirmation for every program.
        let params = json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "gateway-test", "version": "1"},
            "capabilities": {"confirmation": true}});
        let init = r.call(c, OPERATOR, "arp.initialize", params).await;
        assert!(init.get("error").is_none(), "{init}");
        let id = r
            .request(c, OPERATOR, "arp.callTool", drive(0.2, 0.2))
            .await;
        let asked = r
            .wait_for("the confirmation request", |v| {
                v["frame"]["method"] == "arp.requestConfirmation"
            })
            .await;
        assert_eq!(asked["confirmationPolicy"], policy.as_str(), "{asked}");
        let ask_id = asked["frame"]["id"]
            .as_str()
            .expect("a string id")
            .to_owned();
        let hex = ask_id.strip_prefix("confirm-").expect("confirm- prefix");
        assert!(
            hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "128 random bits: {ask_id}"
        );
        let answer = json!({"jsonrpc": "2.0", "id": ask_id,
            "result": {"confirmed": true, "confirmedBy": "planner-7 via client", "timestamp": "2026-11-28T12:00:00Z"}});
        r.frame(c, OPERATOR, answer).await;
        let done = r.response(c, &id).await;
        assert_eq!(done["result"]["state"], "completed", "{done}");
    }
}
