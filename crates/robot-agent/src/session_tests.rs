//! Tests of every `agent.*` handler; every message the agent sends is
//! validated against the spec's schema.

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::*;
use crate::controller;
use crate::driver::{sim, DriverCommand, DriverEnd, DriverEvent, DriverHandle};
use crate::safety::{SafetyLimits, StopReason};
use crate::testutil::{client_now_ms, rfc3339_ms, validated, WAIT};

/// A client message, as a browser would send it, stamped now.
fn msg(kind: &str, payload: Option<Value>, correlation: Option<&str>) -> (String, String) {
    msg_sent(client_now_ms(), kind, payload, correlation)
}

/// A client message stamped `sent_ms` (client Unix ms).
fn msg_sent(
    sent_ms: i64,
    kind: &str,
    payload: Option<Value>,
    correlation: Option<&str>,
) -> (String, String) {
    let id = uuid::Uuid::new_v4().to_string();
    let mut m = json!({
        "type": kind,
        "version": "0.5",
        "id": id,
        "timestamp": rfc3339_ms(sent_ms),
    });
    if let Some(p) = payload {
        m["payload"] = p;
    }
    if let Some(c) = correlation {
        m["correlationId"] = json!(c);
    }
    (m.to_string(), id)
}

struct Rig {
    shared: Shared,
    driver: Option<DriverEnd>,
    outbox_rx: mpsc::Receiver<Envelope>,
    outbox: mpsc::Sender<Envelope>,
}

async fn rig_with(driver: DriverHandle, end: Option<DriverEnd>) -> Rig {
    let limits = SafetyLimits::default();
    let controller = controller::spawn(limits.clone(), driver);
    let (outbox, outbox_rx) = mpsc::channel(32);
    let shared = Shared {
        controller,
        locations: Arc::new(Mutex::new(LocationStore::in_memory(3))),
        settings: Arc::new(Mutex::new(Settings::defaults(&limits))),
        base_limits: limits,
        metrics: Arc::new(crate::session::Metrics::default()),
        reply_signer: None,
    };
    Rig {
        shared,
        driver: end,
        outbox_rx,
        outbox,
    }
}

/// A rig with a scripted driver whose end the test holds.
async fn rig() -> Rig {
    let (handle, end) = DriverHandle::channel();
    end.events.send(DriverEvent::Ready).await.expect("ready");
    let r = rig_with(handle, Some(end)).await;
    wait_ready(&r).await;
    r
}

async fn wait_ready(r: &Rig) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !r
        .shared
        .controller
        .status()
        .await
        .expect("status")
        .driver_ready
    {
        assert!(tokio::time::Instant::now() < deadline, "driver never ready");
        tokio::task::yield_now().await;
    }
}

async fn session(r: &Rig, id: &str, role: Role) -> Session {
    r.shared.controller.attach(id, r.outbox.clone()).await;
    // Requests are handled in order: once this answers, the attach is done
    // (driver events travel on another channel and could overtake it).
    r.shared.controller.status().await.expect("status");
    Session::new(id, role, r.shared.clone())
}

/// Sends one message and returns every reply, including those of a held
/// movement once its burst has settled (the session task's timer, run
/// here by the test).
async fn replies(s: &mut Session, text: &str) -> Vec<Envelope> {
    let mut replies = s.handle_text(text).await;
    while let Some(deadline) = s.deadline() {
        tokio::time::sleep_until(deadline).await;
        replies.extend(s.on_deadline().await);
    }
    replies
}

/// Sends one message and returns the single validated reply.
async fn one(s: &mut Session, text: &str) -> Value {
    let replies = replies(s, text).await;
    assert_eq!(replies.len(), 1, "expected one reply, got {replies:?}");
    validated(&replies[0])
}

async fn none(s: &mut Session, text: &str) {
    let replies = replies(s, text).await;
    assert!(replies.is_empty(), "expected no reply, got {replies:?}");
}

/// Sends `kind` with `payload` and expects the error `code` in answer to it.
async fn refused(s: &mut Session, kind: &str, payload: Value, code: &str) -> Value {
    let (text, id) = msg(kind, Some(payload), None);
    let reply = one(s, &text).await;
    assert_error(&reply, code, Some(&id));
    reply
}

fn assert_error(reply: &Value, code: &str, correlation: Option<&str>) {
    assert_eq!(reply["type"], "agent.error", "{reply}");
    assert_eq!(reply["payload"]["code"], code, "{reply}");
    match correlation {
        Some(c) => assert_eq!(reply["correlationId"], c, "{reply}"),
        None => assert!(reply.get("correlationId").is_none(), "{reply}"),
    }
}

async fn async_message(r: &mut Rig) -> Value {
    let envelope = tokio::time::timeout(WAIT, r.outbox_rx.recv())
        .await
        .expect("message in time")
        .expect("message");
    validated(&envelope)
}

async fn driver_command(r: &mut Rig) -> DriverCommand {
    let end = r.driver.as_mut().expect("scripted driver");
    tokio::time::timeout(WAIT, end.commands.recv())
        .await
        .expect("command in time")
        .expect("command")
}

#[test]
fn capabilities_on_open_are_valid() {
    let caps = validated(&messages::capabilities(&[]));
    assert_eq!(caps["type"], "agent.capabilities");
    assert!(caps["payload"]["versions"]
        .as_array()
        .expect("versions")
        .contains(&json!("0.5")));
    assert_eq!(caps["meta"]["cameras"], json!([]));
}

#[test]
fn cameras_in_capabilities_and_unavailable_ones_as_errors_are_valid() {
    let ok = crate::video::CameraStatus {
        name: "front".into(),
        source: "rtp",
        codec: "H264",
        available: true,
        error: None,
    };
    let broken = crate::video::CameraStatus {
        name: "rear".into(),
        source: "exec",
        codec: "H264",
        available: false,
        error: Some("the command exited (exit status: 1)".into()),
    };
    let caps = validated(&messages::capabilities(&[ok, broken.clone()]));
    assert_eq!(
        caps["meta"]["cameras"],
        json!([
            {"name": "front", "source": "rtp", "codec": "H264", "available": true},
            {"name": "rear", "source": "exec", "codec": "H264", "available": false,
             "error": "the command exited (exit status: 1)"}
        ])
    );
    let error = validated(&messages::camera_unavailable(&broken));
    assert_eq!(error["type"], "agent.error");
    assert_eq!(error["payload"]["code"], "AGENT_UNAVAILABLE");
    assert_eq!(error["payload"]["details"]["reason"], "camera_unavailable");
    assert_eq!(error["payload"]["details"]["camera"], "rear");
}

#[tokio::test]
async fn ping_pong() {
    let r = rig().await;
    let mut s = session(&r, "s", Role::Viewer).await;
    let (text, id) = msg("agent.ping", None, None);
    let pong = one(&mut s, &text).await;
    assert_eq!(pong["type"], "agent.pong");
    assert_eq!(pong["correlationId"], id);
}

#[tokio::test]
async fn client_capabilities_are_checked() {
    let r = rig().await;
    let mut s = session(&r, "s", Role::Viewer).await;
    let (ok, _) = msg(
        "agent.capabilities",
        Some(json!({"versions": ["0.4", "1.0"]})),
        None,
    );
    none(&mut s, &ok).await;
    let (bad, id) = msg(
        "agent.capabilities",
        Some(json!({"versions": ["1.0"]})),
        None,
    );
    assert_error(&one(&mut s, &bad).await, "CAPABILITY_MISMATCH", Some(&id));
}

#[tokio::test]
async fn malformed_messages_get_the_spec_codes() {
    let r = rig().await;
    let mut s = session(&r, "s", Role::Operator).await;
    assert_error(&one(&mut s, "not json").await, "INVALID_MESSAGE", None);
    assert_error(&one(&mut s, "[1,2]").await, "INVALID_MESSAGE", None);

    let (text, id) = msg("agent.ping", None, None);
    let newer = text.replace("\"0.5\"", "\"1.0\"");
    assert_error(&one(&mut s, &newer).await, "UNSUPPORTED_VERSION", Some(&id));

    let (text, id) = msg("agent.teleport", Some(json!({})), None);
    assert_error(
        &one(&mut s, &text).await,
        "UNSUPPORTED_MESSAGE_TYPE",
        Some(&id),
    );

    let (text, id) = msg("signalling.ping", None, None);
    assert_error(
        &one(&mut s, &text).await,
        "UNSUPPORTED_MESSAGE_TYPE",
        Some(&id),
    );

    let (text, id) = msg(
        "agent.movement",
        Some(json!({"forward": 2.0, "turn": 0})),
        None,
    );
    assert_error(&one(&mut s, &text).await, "INVALID_PAYLOAD", Some(&id));

    let (text, id) = msg("agent.movement", Some(json!({"forward": 0.1})), None);
    assert_error(&one(&mut s, &text).await, "INVALID_PAYLOAD", Some(&id));

    // config.get requires a correlationId per the spec.
    let (text, id) = msg("agent.config.get", None, None);
    assert_error(&one(&mut s, &text).await, "VALIDATION_FAILED", Some(&id));

    let (text, id) = msg(
        "agent.location.response",
        Some(json!({"operation": "create"})),
        Some("x"),
    );
    assert_error(
        &one(&mut s, &text).await,
        "UNSUPPORTED_MESSAGE_TYPE",
        Some(&id),
    );

    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(MAX_MESSAGE_BYTES));
    assert_error(&one(&mut s, &big).await, "INVALID_MESSAGE", None);

    // A client's own error or pong is not answered.
    let (text, _) = msg(
        "agent.error",
        Some(json!({"code": "INTERNAL_ERROR", "message": "x"})),
        None,
    );
    none(&mut s, &text).await;
    let (text, _) = msg("agent.pong", None, Some("p"));
    none(&mut s, &text).await;
}

#[tokio::test]
async fn movement_is_scaled_and_viewers_are_refused() {
    let mut r = rig().await;
    let mut op = session(&r, "op", Role::Operator).await;
    let (text, _) = msg(
        "agent.movement",
        Some(json!({"forward": 0.5, "turn": -1.0})),
        None,
    );
    none(&mut op, &text).await;
    match driver_command(&mut r).await {
        DriverCommand::Move { linear, angular } => assert_eq!((linear, angular), (0.25, -1.0)),
        other => panic!("unexpected {other:?}"),
    }

    let mut viewer = session(&r, "viewer", Role::Viewer).await;
    let (text, id) = msg(
        "agent.movement",
        Some(json!({"forward": 0.5, "turn": 0})),
        None,
    );
    let refused = one(&mut viewer, &text).await;
    assert_error(&refused, "MOVEMENT_FAILED", Some(&id));
    assert_eq!(refused["payload"]["details"]["reason"], "forbidden");

    // New limits apply at once.
    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": "safety.max_linear_speed", "value": 2.0})),
        Some("c1"),
    );
    let applied = one(&mut op, &text).await;
    assert_eq!(applied["type"], "agent.config.response");
    assert_eq!(applied["correlationId"], id);
    assert_eq!(
        applied["payload"],
        json!({"key": "safety.max_linear_speed", "applied": true, "restartRequired": false})
    );
    let (text, _) = msg(
        "agent.movement",
        Some(json!({"forward": 0.5, "turn": 0})),
        None,
    );
    none(&mut op, &text).await;
    match driver_command(&mut r).await {
        DriverCommand::Move { linear, .. } => assert_eq!(linear, 1.0),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn emergency_stop_refuses_movement_until_reset() {
    let mut r = rig().await;
    let mut op = session(&r, "op", Role::Operator).await;
    let mut viewer = session(&r, "viewer", Role::Viewer).await;
    r.driver
        .as_ref()
        .expect("driver")
        .events
        .send(DriverEvent::EmergencyStop {
            reason: "button".into(),
        })
        .await
        .expect("event");
    // Both sessions are told.
    for _ in 0..2 {
        let note = async_message(&mut r).await;
        assert_error(&note, "MOVEMENT_FAILED", None);
        assert_eq!(note["payload"]["details"]["reason"], "emergency_stop");
    }
    let (text, id) = msg(
        "agent.movement",
        Some(json!({"forward": 0.1, "turn": 0})),
        None,
    );
    let refused = one(&mut op, &text).await;
    assert_error(&refused, "MOVEMENT_FAILED", Some(&id));
    assert_eq!(refused["payload"]["details"]["latched"], true);

    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": ESTOP_RESET_KEY, "value": true})),
        Some("c"),
    );
    assert_error(
        &one(&mut viewer, &text).await,
        "VALIDATION_FAILED",
        Some(&id),
    );
    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": ESTOP_RESET_KEY, "value": "yes"})),
        Some("c"),
    );
    assert_error(&one(&mut op, &text).await, "VALIDATION_FAILED", Some(&id));
    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": ESTOP_RESET_KEY, "value": true})),
        Some("c"),
    );
    let reset = one(&mut op, &text).await;
    assert_eq!(reset["type"], "agent.config.response");
    assert_eq!(reset["correlationId"], id);

    let (text, _) = msg(
        "agent.movement",
        Some(json!({"forward": 0.1, "turn": 0})),
        None,
    );
    none(&mut op, &text).await;
}

async fn viewers_list_locations_but_change_none(r: &Rig) {
    let mut viewer = session(r, "v", Role::Viewer).await;
    let (text, _) = msg("agent.location.list", Some(json!({})), None);
    assert_eq!(
        one(&mut viewer, &text).await["payload"]["locations"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    refused(
        &mut viewer,
        "agent.location.delete",
        json!({"name": "a"}),
        "VALIDATION_FAILED",
    )
    .await;
}

#[tokio::test]
async fn locations_crud() {
    let r = rig().await;
    let mut op = session(&r, "op", Role::Owner).await;
    let dock = json!({"name": "Dock", "position": {"x": 1.5, "y": -2.0}, "orientation": {"yaw": 1.57}, "metadata": {"zone": "a"}});

    let (text, id) = msg("agent.location.create", Some(dock.clone()), None);
    let created = one(&mut op, &text).await;
    assert_eq!(created["type"], "agent.location.response");
    assert_eq!(created["correlationId"], id);
    assert_eq!(created["payload"], json!({"operation": "create"}));

    let create = "agent.location.create";
    refused(&mut op, create, dock.clone(), "LOCATION_ALREADY_EXISTS").await;
    let bad = json!({"name": " bad", "position": {"x": 0, "y": 0}});
    refused(&mut op, create, bad, "LOCATION_NAME_INVALID").await;

    let (text, id) = msg("agent.location.list", Some(json!({})), None);
    let list = one(&mut op, &text).await;
    assert_eq!(list["correlationId"], id);
    assert_eq!(
        list["payload"],
        json!({"operation": "list", "locations": [dock]})
    );

    let moved = json!({"name": "Dock", "position": {"x": 3.0, "y": 4.0}});
    let (text, _) = msg("agent.location.update", Some(moved.clone()), None);
    assert_eq!(
        one(&mut op, &text).await["payload"],
        json!({"operation": "update"})
    );
    let (text, id) = msg(
        "agent.location.update",
        Some(json!({"name": "Nope", "position": {"x": 0, "y": 0}})),
        None,
    );
    let missing = one(&mut op, &text).await;
    assert_error(&missing, "LOCATION_NOT_FOUND", Some(&id));
    assert_eq!(missing["payload"]["details"]["operation"], "update");
    assert_eq!(missing["payload"]["details"]["requestedName"], "Nope");

    // Storage holds 3 in this rig.
    for name in ["a", "b"] {
        let (text, _) = msg(
            "agent.location.create",
            Some(json!({"name": name, "position": {"x": 0, "y": 0}})),
            None,
        );
        one(&mut op, &text).await;
    }
    refused(
        &mut op,
        "agent.location.create",
        json!({"name": "c", "position": {"x": 0, "y": 0}}),
        "LOCATION_STORAGE_FULL",
    )
    .await;

    let (text, _) = msg("agent.location.delete", Some(json!({"name": "Dock"})), None);
    assert_eq!(
        one(&mut op, &text).await["payload"],
        json!({"operation": "delete"})
    );
    refused(
        &mut op,
        "agent.location.delete",
        json!({"name": "Dock"}),
        "LOCATION_NOT_FOUND",
    )
    .await;

    // Viewers may list but not change.
    viewers_list_locations_but_change_none(&r).await;
}

async fn start_and_cancel(r: &mut Rig, op: &mut Session) {
    let (text, _) = msg(
        "agent.location.update",
        Some(json!({"name": "desk", "position": {"x": 5.0, "y": 5.0}})),
        None,
    );
    one(op, &text).await;
    let (text2, start_id2) = msg(
        "agent.navigation.start",
        Some(json!({"name": "desk"})),
        None,
    );
    none(op, &text2).await;
    assert_eq!(async_message(r).await["payload"]["status"], "started");
    let (text, cancel_id) = msg("agent.navigation.cancel", Some(json!({})), None);
    let cancelled = one(op, &text).await;
    assert_eq!(cancelled["correlationId"], cancel_id);
    assert_eq!(
        cancelled["payload"],
        json!({"status": "cancelled", "name": "desk"})
    );
    let for_start = async_message(r).await;
    assert_eq!(for_start["correlationId"], start_id2);
    assert_eq!(for_start["payload"]["status"], "cancelled");
}

#[tokio::test(start_paused = true)]
async fn navigation_through_the_sim_driver() {
    let (handle, end) = DriverHandle::channel();
    let probe = sim::spawn(end, sim::SimConfig::default());
    let mut r = rig_with(handle, None).await;
    wait_ready(&r).await;
    let mut op = session(&r, "op", Role::Operator).await;
    let (text, _) = msg(
        "agent.location.create",
        Some(json!({"name": "desk", "position": {"x": 0.5, "y": 0.5}})),
        None,
    );
    one(&mut op, &text).await;

    refused(
        &mut op,
        "agent.navigation.start",
        json!({"name": "nowhere"}),
        "LOCATION_NOT_FOUND",
    )
    .await;

    let mut viewer = session(&r, "v", Role::Viewer).await;
    refused(
        &mut viewer,
        "agent.navigation.start",
        json!({"name": "desk"}),
        "MOVEMENT_FAILED",
    )
    .await;

    refused(
        &mut op,
        "agent.navigation.cancel",
        json!({}),
        "NAVIGATION_NOT_ACTIVE",
    )
    .await;

    let (text, start_id) = msg(
        "agent.navigation.start",
        Some(json!({"name": "desk"})),
        None,
    );
    none(&mut op, &text).await;
    let started = async_message(&mut r).await;
    assert_eq!(started["type"], "agent.navigation.response");
    assert_eq!(started["correlationId"], start_id);
    assert_eq!(
        started["payload"],
        json!({"status": "started", "name": "desk"})
    );

    refused(
        &mut op,
        "agent.navigation.start",
        json!({"name": "desk"}),
        "NAVIGATION_ALREADY_ACTIVE",
    )
    .await;

    let completed = async_message(&mut r).await;
    assert_eq!(completed["correlationId"], start_id);
    assert_eq!(
        completed["payload"],
        json!({"status": "completed", "name": "desk"})
    );
    let pose = probe.state();
    assert!(
        (pose.x - 0.5).abs() < 0.06 && (pose.y - 0.5).abs() < 0.06,
        "{pose:?}"
    );

    // Start again (to a far target) and cancel: the cancel is answered, and
    // so is the start.
    start_and_cancel(&mut r, &mut op).await;
}

#[tokio::test]
async fn config_get_and_update() {
    let r = rig().await;
    let mut op = session(&r, "op", Role::Operator).await;
    let (text, id) = msg("agent.config.get", None, Some("cfg"));
    let got = one(&mut op, &text).await;
    assert_eq!(got["type"], "agent.config.get.response");
    assert_eq!(got["correlationId"], id);
    assert_eq!(got["payload"]["config"]["image_format"], "Jpeg");
    assert_eq!(got["payload"]["config"]["ros.cmd_vel_topic"], "/cmd_vel");

    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": "resolution", "value": "1280x720"})),
        Some("c"),
    );
    let applied = one(&mut op, &text).await;
    assert_eq!(applied["correlationId"], id);
    assert_eq!(
        applied["payload"],
        json!({"key": "resolution", "applied": true, "restartRequired": true})
    );

    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": "resolution", "value": "big"})),
        Some("c"),
    );
    assert_error(&one(&mut op, &text).await, "VALIDATION_FAILED", Some(&id));
    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": "warp_drive", "value": 9})),
        Some("c"),
    );
    assert_error(&one(&mut op, &text).await, "VALIDATION_FAILED", Some(&id));
    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": "ros.cmd_vel_topic", "value": "/bad topic"})),
        Some("c"),
    );
    assert_error(&one(&mut op, &text).await, "VALIDATION_FAILED", Some(&id));
    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": "", "value": 1})),
        Some("c"),
    );
    assert_error(&one(&mut op, &text).await, "INVALID_PAYLOAD", Some(&id));
    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": "resolution"})),
        Some("c"),
    );
    assert_error(&one(&mut op, &text).await, "INVALID_PAYLOAD", Some(&id));

    let (text, _) = msg("agent.config.get", None, Some("cfg"));
    assert_eq!(
        one(&mut op, &text).await["payload"]["config"]["resolution"],
        "1280x720"
    );

    let mut viewer = session(&r, "v", Role::Viewer).await;
    let (text, id) = msg(
        "agent.config.update",
        Some(json!({"key": "resolution", "value": "640x480"})),
        Some("c"),
    );
    assert_error(
        &one(&mut viewer, &text).await,
        "VALIDATION_FAILED",
        Some(&id),
    );
}

#[tokio::test(start_paused = true)]
async fn floods_are_limited() {
    let r = rig().await;
    let mut s = session(&r, "s", Role::Viewer).await;
    let (text, _) = msg("agent.ping", None, None);
    let mut pongs = 0;
    let mut errors = 0;
    for _ in 0..(MESSAGE_BURST as usize + 50) {
        for reply in s.handle_text(&text).await {
            let v = validated(&reply);
            match v["type"].as_str() {
                Some("agent.pong") => pongs += 1,
                Some("agent.error") => {
                    assert_eq!(v["payload"]["details"]["reason"], "rate_limited");
                    errors += 1
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(pongs, MESSAGE_BURST as usize);
    assert_eq!(errors, 1, "one error per second at most");
}

fn movement(sent_ms: i64) -> (String, String) {
    msg_sent(
        sent_ms,
        "agent.movement",
        Some(json!({"forward": 0.5, "turn": 0})),
        None,
    )
}

fn assert_stale(reply: &Value, correlation: Option<&str>, cause: &str) {
    assert_error(reply, "MOVEMENT_FAILED", correlation);
    assert_eq!(reply["payload"]["details"]["reason"], "stale", "{reply}");
    assert_eq!(reply["payload"]["details"]["cause"], cause, "{reply}");
}

async fn expect_move(r: &mut Rig) {
    match driver_command(r).await {
        DriverCommand::Move { linear, .. } => assert_eq!(linear, 0.25),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn stale_movement_is_refused_counted_and_fresh_motion_resumes() {
    let mut r = rig().await;
    let mut op = session(&r, "op", Role::Operator).await;
    let step = Duration::from_millis(100);
    for _ in 0..5 {
        let (text, _) = movement(client_now_ms());
        none(&mut op, &text).await;
        expect_move(&mut r).await;
        tokio::time::advance(step).await;
    }
    // Queued during an outage: sent 2 s ago, delivered now.
    let (text, id) = movement(client_now_ms() - 2_000);
    assert_stale(&one(&mut op, &text).await, Some(&id), "late");
    // A timestamp from the future beyond the tolerance.
    let (text, id) = movement(client_now_ms() + 5_000);
    assert_stale(&one(&mut op, &text).await, Some(&id), "future");
    assert_eq!(r.shared.metrics.stale_commands(), 2);
    assert_eq!(op.stale_run(), 2);
    // A fresh command drives again.
    let (text, _) = movement(client_now_ms());
    none(&mut op, &text).await;
    expect_move(&mut r).await;
    assert_eq!(op.stale_run(), 0);
}

#[tokio::test(start_paused = true)]
async fn burst_after_silence_runs_only_its_newest() {
    let mut r = rig().await;
    let mut op = session(&r, "op", Role::Operator).await;
    let (text, _) = movement(client_now_ms());
    none(&mut op, &text).await;
    expect_move(&mut r).await;
    // One second of silence, then three queued commands at once; the two
    // older are superseded, the newest (sent 50 ms ago) runs.
    tokio::time::advance(Duration::from_secs(1)).await;
    match driver_command(&mut r).await {
        DriverCommand::Stop { reason } => assert_eq!(reason, StopReason::Watchdog),
        other => panic!("unexpected {other:?}"),
    }
    let now = client_now_ms();
    let (a, a_id) = movement(now - 250);
    let (b, b_id) = movement(now - 150);
    let (c, _) = movement(now - 50);
    assert!(op.handle_text(&a).await.is_empty());
    let superseded = op.handle_text(&b).await;
    assert_stale(&validated(&superseded[0]), Some(&a_id), "superseded");
    let superseded = op.handle_text(&c).await;
    assert_stale(&validated(&superseded[0]), Some(&b_id), "superseded");
    let deadline = op.deadline().expect("the newest is held");
    tokio::time::sleep_until(deadline).await;
    assert!(op.on_deadline().await.is_empty());
    expect_move(&mut r).await;
    assert_eq!(r.shared.metrics.stale_commands(), 2);
}

#[tokio::test(start_paused = true)]
async fn legacy_movement_command_drives_on_a_steady_stream_only() {
    let mut r = rig().await;
    let mut op = session(&r, "op", Role::Operator).await;
    let legacy = r#"{"type":"MovementCommand","params":{"forward":0.5,"turn":0}}"#;
    // The first two after a silence only prove the stream is live.
    for _ in 0..2 {
        let reply = one(&mut op, legacy).await;
        assert_stale(&reply, None, "not_steady");
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    none(&mut op, legacy).await;
    expect_move(&mut r).await;
    tokio::time::advance(Duration::from_millis(100)).await;
    none(&mut op, legacy).await;
    expect_move(&mut r).await;

    // An outage, then its backlog released back to back: none runs.
    tokio::time::advance(Duration::from_secs(5)).await;
    for _ in 0..30 {
        assert_stale(&one(&mut op, legacy).await, None, "not_steady");
    }
    let bad = r#"{"type":"MovementCommand","params":{"forward":3,"turn":0}}"#;
    assert_error(&one(&mut op, bad).await, "INVALID_PAYLOAD", None);
    // Viewers may not drive in the legacy form either.
    let mut viewer = session(&r, "v", Role::Viewer).await;
    let refused = one(&mut viewer, legacy).await;
    assert_eq!(refused["payload"]["details"]["reason"], "forbidden");
}

#[tokio::test(start_paused = true)]
async fn stale_navigation_start_and_estop_reset_are_refused() {
    let mut r = rig().await;
    let mut op = session(&r, "op", Role::Operator).await;
    let (text, _) = msg(
        "agent.location.create",
        Some(json!({"name": "desk", "position": {"x": 0.5, "y": 0.5}})),
        None,
    );
    one(&mut op, &text).await;
    tokio::time::advance(Duration::from_millis(100)).await;

    let (text, id) = msg_sent(
        client_now_ms() - 3_000,
        "agent.navigation.start",
        Some(json!({"name": "desk"})),
        None,
    );
    assert_stale(&one(&mut op, &text).await, Some(&id), "late");

    r.driver
        .as_ref()
        .expect("driver")
        .events
        .send(DriverEvent::EmergencyStop {
            reason: "button".into(),
        })
        .await
        .expect("event");
    // The e-stop is honoured at once, whatever else is going on.
    match driver_command(&mut r).await {
        DriverCommand::Stop { reason } => assert_eq!(reason, StopReason::EmergencyStop),
        other => panic!("unexpected {other:?}"),
    }
    let note = async_message(&mut r).await;
    assert_eq!(note["payload"]["details"]["reason"], "emergency_stop");

    let (text, id) = msg_sent(
        client_now_ms() - 3_000,
        "agent.config.update",
        Some(json!({"key": ESTOP_RESET_KEY, "value": true})),
        Some("c"),
    );
    assert_stale(&one(&mut op, &text).await, Some(&id), "late");
    assert!(r
        .shared
        .controller
        .status()
        .await
        .expect("status")
        .estop
        .is_some());
    let (text, _) = msg(
        "agent.config.update",
        Some(json!({"key": ESTOP_RESET_KEY, "value": true})),
        Some("c"),
    );
    assert_eq!(one(&mut op, &text).await["type"], "agent.config.response");
    assert!(r
        .shared
        .controller
        .status()
        .await
        .expect("status")
        .estop
        .is_none());
}
