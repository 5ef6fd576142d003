//! The ARP server over its local WebSocket, on 127.0.0.1:0, with the sim
//! driver. Every frame either way is validated against the ARP schema.

use serde_json::{json, Value};
use signalling_protocol::arp_schema::ArpValidator;

use super::ws::ArpListener;
use super::*;
use crate::driver::DriverHandle;
use crate::testutil::arp::{fixture, secret, until, Client, Fixture, OPERATOR, OPERATOR2, VIEWER};
use crate::testutil::WAIT;

async fn raw(c: &mut Client, text: &str) -> Value {
    c.send_raw(text).await;
    c.read().await
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_comes_first_then_every_listing_method_answers() {
    let f = fixture(ArpOptions::default()).await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    let early = c.call("arp.listTools", json!({})).await;
    assert_eq!(code(&early), -40009);
    let init = c.initialize().await;
    assert_eq!(init["protocolVersion"], "0.1.0");
    assert_eq!(
        init["capabilities"]["planning"], false,
        "requestPlan is not offered"
    );
    assert_eq!(init["capabilities"]["confirmation"], true);
    let again = c
        .call(
            "arp.initialize",
            json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "t", "version": "1"}}),
        )
        .await;
    assert_eq!(code(&again), -32600);

    let tools = c.result("arp.listTools", json!({})).await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "drive",
            "stop",
            "navigate_to",
            "cancel_navigation",
            "save_location",
            "list_locations",
            "capture_image",
            "reset_emergency_stop"
        ]
    );
    for tool in tools["tools"].as_array().expect("tools") {
        // Each tool's parameters are a JSON Schema that compiles.
        jsonschema::validator_for(&tool["parameters"]).expect("parameters schema");
    }
    let sources = c.result("arp.listContext", json!({})).await;
    assert_eq!(sources["sources"][0]["name"], "status");
    assert_eq!(sources["sources"][1]["name"], "odometry");
    assert_eq!(sources["sources"][1]["dataType"], "pose");
    let constraints = c.result("arp.listConstraints", json!({})).await;
    let types: Vec<&str> = constraints["constraints"]
        .as_array()
        .expect("constraints")
        .iter()
        .map(|c| c["type"].as_str().expect("type"))
        .collect();
    assert_eq!(types, ["velocity_limit", "rate_limit", "emergency_stop"]);
    let velocity = c
        .result("arp.getConstraint", json!({"name": "velocity_limit"}))
        .await;
    assert_eq!(
        velocity["parameters"],
        json!({"max_linear": 0.5, "max_angular": 1.0})
    );
    assert_eq!(velocity["violation_action"], "reject");
    let missing = c
        .call("arp.getConstraint", json!({"name": "gravity"}))
        .await;
    assert_eq!(code(&missing), -32602);
    assert_eq!(missing["error"]["data"]["field"], "name");
    let unknown_tool = c.tool("fly", json!({})).await;
    assert_eq!(code(&unknown_tool), -40003);
    let unknown_source = c
        .call("arp.subscribeContext", json!({"name": "lidar"}))
        .await;
    assert_eq!(code(&unknown_source), -40008);
    let locations = c.tool("list_locations", json!({})).await;
    assert_eq!(locations["result"]["state"], "completed");
    assert_eq!(c.result("arp.shutdown", json!({})).await, json!({}));
    assert_eq!(code(&c.call("arp.listTools", json!({})).await), -40009);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_json_rpc_errors_and_nothing_moves() {
    let f = fixture(ArpOptions::default()).await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    assert_eq!(code(&raw(&mut c, "{not json").await), -32700);
    let batch = raw(
        &mut c,
        r#"[{"jsonrpc":"2.0","id":1,"method":"arp.listTools"}]"#,
    )
    .await;
    assert_eq!(code(&batch), -32600);
    assert!(batch["error"]["message"]
        .as_str()
        .expect("m")
        .contains("batch"));
    assert_eq!(
        code(&raw(&mut c, r#"{"id":2,"method":"arp.listTools"}"#).await),
        -32600
    );
    assert_eq!(
        code(
            &raw(
                &mut c,
                r#"{"jsonrpc":"2.0","id":{"x":1},"method":"arp.listTools"}"#
            )
            .await
        ),
        -32600
    );
    let wrong = raw(
        &mut c,
        r#"{"jsonrpc":"2.0","id":3,"method":"arp.teleport"}"#,
    )
    .await;
    assert_eq!((code(&wrong), wrong["id"].clone()), (-32601, json!(3)));
    let robot_side = raw(
        &mut c,
        r#"{"jsonrpc":"2.0","id":4,"method":"arp.toolProgress","params":{}}"#,
    )
    .await;
    assert_eq!(code(&robot_side), -32601);
    let not_object = raw(
        &mut c,
        r#"{"jsonrpc":"2.0","id":5,"method":"arp.listTools","params":[1]}"#,
    )
    .await;
    assert_eq!(code(&not_object), -32602);
    let bad_args = c
        .tool(
            "drive",
            json!({"linear": 0.1, "angular": 0, "durationSecs": "long"}),
        )
        .await;
    assert_eq!(code(&bad_args), -32602);
    assert_eq!(bad_args["error"]["data"]["field"], "arguments.durationSecs");
    let missing = c
        .call_invalid("arp.callTool", json!({"arguments": {}}))
        .await;
    assert_eq!(missing["error"]["data"]["field"], "name");
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":6,"method":"arp.listTools","params":{{"pad":"{}"}}}}"#,
        "x".repeat(70 * 1024)
    );
    assert_eq!(code(&raw(&mut c, &huge).await), -32600);
    // A flood: the budget (200 burst, 100/s) runs out; one error says so.
    for _ in 0..400 {
        c.send_raw(r#"{"jsonrpc":"2.0","method":"arp.noop"}"#).await;
    }
    let limited = c.read().await;
    assert_eq!(code(&limited), -40001);
    assert_eq!(limited["error"]["data"]["reason"], "rate_limited");
    assert_eq!(f.probe.state().x, 0.0, "nothing moved");
    assert!(f.server.state().calls.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_checked_before_the_upgrade_and_roles_follow_them() {
    let f = fixture(ArpOptions::default()).await;
    for url in [f.url.clone(), format!("{}?token=wrong", f.url)] {
        match tokio_tungstenite::connect_async(url).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 401);
            }
            other => panic!("expected 401, got {other:?}"),
        }
    }
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
            f.url.as_str(),
        )
        .expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", secret(VIEWER))
            .parse()
            .expect("header"),
    );
    let (ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("bearer works");
    drop(ws);

    // One controller: a second operator is busy, a viewer is fine.
    let mut op = Client::connect(&f.url, OPERATOR).await;
    op.initialize().await;
    let mut op2 = Client::connect(&f.url, OPERATOR2).await;
    let init = || json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "t", "version": "1"}});
    let busy = op2.call("arp.initialize", init()).await;
    assert_eq!(code(&busy), -40004);
    assert_eq!(busy["error"]["data"]["reason"], "robot_busy");
    let mut viewer = Client::connect(&f.url, VIEWER).await;
    viewer.initialize().await;
    let forbidden = viewer
        .tool(
            "drive",
            json!({"linear": 0.1, "angular": 0, "durationSecs": 1}),
        )
        .await;
    assert_eq!(code(&forbidden), -40001);
    assert_eq!(forbidden["error"]["data"]["reason"], "forbidden");
    let ws = viewer
        .call(
            "arp.setWorkspace",
            json!({"name": "w", "bounds": {"type": "box", "min": [-1, -1], "max": [1, 1]}}),
        )
        .await;
    assert_eq!(ws["error"]["data"]["reason"], "forbidden");
    assert_eq!(
        viewer.tool("list_locations", json!({})).await["result"]["state"],
        "completed"
    );
    // The controller leaves: the other operator may take over.
    op.ws.close(None).await.expect("close");
    let deadline = Instant::now() + WAIT;
    loop {
        let v = op2.call("arp.initialize", init()).await;
        if v.get("result").is_some() {
            break;
        }
        assert_eq!(code(&v), -40004);
        assert!(Instant::now() < deadline, "control never released");
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drive_reports_progress_completes_and_the_sim_moved() {
    let f = fixture(ArpOptions::default()).await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    let id = c.request("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.25, "angular": 0.0, "durationSecs": 1.0}})).await;
    let first = c.message("arp.toolProgress").await;
    assert_eq!(first["params"]["progress"], 0.0);
    let call_id = first["params"]["callId"].clone();
    let done = c.response(&id).await;
    assert_eq!(done["result"]["callId"], call_id);
    assert_eq!(done["result"]["state"], "completed");
    let progress: Vec<f64> = c
        .backlog
        .iter()
        .filter(|v| v["method"] == "arp.toolProgress")
        .map(|v| v["params"]["progress"].as_f64().expect("progress"))
        .collect();
    assert!(progress.len() >= 8, "progress every 10 %: {progress:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    until(&f.probe, "stopped after the drive", |s| s.linear == 0.0).await;
    let x = f.probe.state().x;
    assert!((x - 0.25).abs() < 0.06, "moved 0.25 m, x = {x}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn velocity_over_the_limit_is_rejected_or_clamped() {
    let f = fixture(ArpOptions::default()).await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    let refused = c
        .tool(
            "drive",
            json!({"linear": 2.0, "angular": 0.0, "durationSecs": 0.5}),
        )
        .await;
    assert_eq!(code(&refused), -40001);
    let data = &refused["error"]["data"];
    assert_eq!(data["constraint"], "velocity_limit");
    assert_eq!(data["requested"], json!({"linear": 2.0, "angular": 0.0}));
    assert_eq!(
        data["limit"],
        json!({"max_linear": 0.5, "max_angular": 1.0})
    );
    assert_eq!(data["state"], "failed");
    assert_eq!(f.probe.state().x, 0.0);
    drop(c);
    drop(f);

    let f = fixture(ArpOptions {
        velocity_violation: ViolationAction::Clamp,
        ..ArpOptions::default()
    })
    .await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    let velocity = c
        .result("arp.getConstraint", json!({"name": "velocity_limit"}))
        .await;
    assert_eq!(velocity["violation_action"], "clamp");
    let clamped = c
        .tool(
            "drive",
            json!({"linear": 2.0, "angular": 0.0, "durationSecs": 0.5}),
        )
        .await;
    assert_eq!(clamped["result"]["state"], "completed");
    assert_eq!(clamped["result"]["result"]["linear"], 0.5);
    until(&f.probe, "stopped", |s| s.linear == 0.0).await;
    let x = f.probe.state().x;
    assert!((x - 0.25).abs() < 0.06, "0.5 m/s for 0.5 s, x = {x}");
}

/// Teleop drives on past the workspace's edge: the monitor stops it just
/// outside.
async fn teleop_stopped_at_the_edge(f: &Fixture) {
    f.controller
        .take_control(&crate::controller::control::Claimant::Teleop(
            "teleop".into(),
        ))
        .expect("control is free");
    for _ in 0..200 {
        if f.probe.state().last_stop.as_deref() == Some("workspace_bound") {
            break;
        }
        let _ = f
            .controller
            .movement("teleop", Role::Operator, 1.0, 0.0)
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until(&f.probe, "stopped at the edge", |s| {
        s.last_stop.as_deref() == Some("workspace_bound")
    })
    .await;
    let x = f.probe.state().x;
    assert!(x > 0.5 && x < 0.6, "stopped just outside, x = {x}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_exits_are_refused_and_a_robot_leaving_anyway_is_stopped() {
    let f = fixture(ArpOptions {
        workspace: Some(
            Workspace::new("cell".into(), vec![-1.0, -1.0], vec![1.0, 1.0]).expect("box"),
        ),
        ..ArpOptions::default()
    })
    .await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    let listed = c
        .result("arp.getConstraint", json!({"name": "workspace_bound"}))
        .await;
    assert_eq!(listed["parameters"]["min"], json!([-1.0, -1.0]));
    let out = c
        .tool(
            "drive",
            json!({"linear": 0.5, "angular": 0.0, "durationSecs": 3.0}),
        )
        .await;
    assert_eq!(code(&out), -40001);
    assert_eq!(out["error"]["data"]["constraint"], "workspace_bound");
    assert_eq!(f.probe.state().x, 0.0);
    // Wider than the configured box: refused; narrower: applied.
    let wider = c
        .call(
            "arp.setWorkspace",
            json!({"name": "big", "bounds": {"type": "box", "min": [-5, -5], "max": [5, 5]}}),
        )
        .await;
    assert_eq!(code(&wider), -40001);
    c.result("arp.setWorkspace", json!({"name": "small", "bounds": {"type": "box", "min": [-0.5, -0.5, 0], "max": [0.5, 0.5, 1], "frame": "odom"}})).await;
    let now_out = c
        .tool(
            "drive",
            json!({"linear": 0.5, "angular": 0.0, "durationSecs": 1.5}),
        )
        .await;
    assert_eq!(now_out["error"]["data"]["constraint"], "workspace_bound");
    // A location outside the box is refused too.
    f.server
        .shared()
        .locations
        .lock()
        .expect("lock")
        .create(signalling_protocol::Location {
            name: "far".into(),
            position: signalling_protocol::Position {
                x: 3.0,
                y: 0.0,
                z: None,
            },
            orientation: None,
            metadata: None,
        })
        .expect("create");
    let nav = c.tool("navigate_to", json!({"location": "far"})).await;
    assert_eq!(nav["error"]["data"]["constraint"], "workspace_bound");
    // Teleop (not ARP) drives out anyway: the monitor stops it. One
    // controller: the ARP operator hands control over first.
    c.result("arp.shutdown", json!({})).await;
    teleop_stopped_at_the_edge(&f).await;
}

/// The latched e-stop's reason, if any.
async fn estop_reason(f: &Fixture) -> Option<String> {
    f.controller.status().await.expect("status").estop
}

/// An e-stop with malformed params, and one as a notification: both latch.
async fn odd_emergency_stops_still_latch(f: &Fixture, op: &mut Client, viewer: &mut Client) {
    let op_reset = op.tool("reset_emergency_stop", json!({})).await;
    assert_eq!(op_reset["result"]["state"], "completed");
    let odd = viewer
        .call_invalid("arp.emergencyStop", json!({"reason": 42}))
        .await;
    assert_eq!(odd["result"]["stopped"], true);
    assert_eq!(estop_reason(f).await.as_deref(), Some("arp.emergencyStop"));
    op.message("arp.emergencyStop").await;
    op.tool("reset_emergency_stop", json!({})).await;
    // The notification form: no answer, still latches.
    viewer
        .send(
            json!({"jsonrpc": "2.0", "method": "arp.emergencyStop", "params": {"reason": "again"}}),
        )
        .await;
    op.message("arp.emergencyStop").await;
    assert_eq!(estop_reason(f).await.as_deref(), Some("again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_estop_mid_drive_stops_the_sim_and_fails_the_call() {
    let f = fixture(ArpOptions::default()).await;
    let mut op = Client::connect(&f.url, OPERATOR).await;
    op.initialize().await;
    let mut viewer = Client::connect(&f.url, VIEWER).await;
    viewer.initialize().await;
    let id = op.request("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.3, "angular": 0.0, "durationSecs": 10.0}})).await;
    let call_id = op.message("arp.toolProgress").await["params"]["callId"].clone();
    until(&f.probe, "moving", |s| s.linear > 0.0).await;
    let stopped = viewer
        .result("arp.emergencyStop", json!({"reason": "person in the way"}))
        .await;
    assert_eq!(stopped, json!({"stopped": true}));
    // The stop was queued to the driver before the answer: the sim moves
    // for at most the tick it is in (and one it may run before reading the
    // queue), 0.3 m/s × 20 ms each, then stands.
    let at_answer = f.probe.state().x;
    until(&f.probe, "stopped", |s| s.linear == 0.0).await;
    let travelled = f.probe.state().x - at_answer;
    assert!(
        travelled <= 0.3 * 0.020 * 2.0 + 1e-9,
        "moved {travelled} m after the e-stop"
    );
    assert_eq!(f.probe.state().last_stop.as_deref(), Some("emergency_stop"));
    let failed = op.response(&id).await;
    assert_eq!(code(&failed), -40007);
    assert_eq!(failed["error"]["data"]["callId"], call_id);
    assert_eq!(failed["error"]["data"]["state"], "failed");
    let notice = op.message("arp.emergencyStop").await;
    assert_eq!(notice["params"]["reason"], "person in the way");
    assert!(notice.get("id").is_none(), "a notification");
    viewer.message("arp.emergencyStop").await;
    let latched = op
        .tool(
            "drive",
            json!({"linear": 0.1, "angular": 0.0, "durationSecs": 1.0}),
        )
        .await;
    assert_eq!(code(&latched), -40007);
    assert_eq!(
        code(&viewer.tool("reset_emergency_stop", json!({})).await),
        -40001
    );
    let reset = op.tool("reset_emergency_stop", json!({})).await;
    assert_eq!(reset["result"]["result"]["reset"], true);
    let again = op
        .tool(
            "drive",
            json!({"linear": 0.1, "angular": 0.0, "durationSecs": 0.2}),
        )
        .await;
    assert_eq!(again["result"]["state"], "completed");
    // Malformed params never stand in the way of an e-stop.
    odd_emergency_stops_still_latch(&f, &mut op, &mut viewer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmation_confirmed_denied_and_timed_out() {
    let f = fixture(ArpOptions {
        confirm: HashMap::from([("drive".to_owned(), true)]),
        confirmation_timeout: Duration::from_millis(300),
        ..ArpOptions::default()
    })
    .await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    let tools = c.result("arp.listTools", json!({})).await;
    assert_eq!(tools["tools"][0]["safety"]["requiresConfirmation"], true);
    let drive =
        json!({"name": "drive", "arguments": {"linear": 0.2, "angular": 0.0, "durationSecs": 0.2}});

    let id = c.request("arp.callTool", drive.clone()).await;
    let ask = c.message("arp.requestConfirmation").await;
    let first_ask = ask["id"].clone();
    assert_eq!(ask["params"]["details"]["tool"], "drive");
    assert_eq!(ask["params"]["safetyLevel"], "elevated");
    assert_eq!(
        f.probe.state().linear,
        0.0,
        "nothing moves before the answer"
    );
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"confirmed": true, "confirmedBy": "operator_jane", "timestamp": "2026-11-25T13:00:00Z"}});
    ArpValidator::shared()
        .validate(&answer, Some("arp.requestConfirmation"))
        .expect("valid answer");
    c.send_raw(&answer.to_string()).await;
    assert_eq!(c.response(&id).await["result"]["state"], "completed");
    assert!(f.probe.state().x > 0.0);
    // The answer can come a tick before the sim applies the drive's final stop: the
    // position is read once the robot stands still, or a last tick looks like a move.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while f.probe.state().linear != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the drive never stopped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let x = f.probe.state().x;
    let id = c.request("arp.callTool", drive.clone()).await;
    let ask = c.message("arp.requestConfirmation").await;
    assert_ne!(ask["id"], first_ask, "every request has its own id");
    for asked in [&ask["id"], &first_ask] {
        let id = asked.as_str().expect("a string id");
        let hex = id.strip_prefix("confirm-").expect("confirm- prefix");
        assert!(
            hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "an id of 128 random bits, not a counter: {id}"
        );
    }
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"confirmed": false, "confirmedBy": "operator_jane", "timestamp": "2026-11-25T13:00:01Z"}});
    c.send_raw(&answer.to_string()).await;
    let denied = c.response(&id).await;
    assert_eq!(code(&denied), -40006);
    assert_eq!(denied["error"]["data"]["confirmedBy"], "operator_jane");

    let id = c.request("arp.callTool", drive).await;
    c.message("arp.requestConfirmation").await;
    let timed_out = c.response(&id).await;
    assert_eq!(code(&timed_out), -40005);
    assert_eq!(f.probe.state().x, x, "neither moved");
}

/// A local client that did not declare `capabilities.confirmation` is never asked: the call
/// that needs a person is denied at once, the robot does not move, and answers it sends in
/// a person's name (with ids a counter would have given) reach nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_confirm_is_never_asked_and_cannot_answer() {
    let f = fixture(ArpOptions {
        confirm: HashMap::from([("drive".to_owned(), true)]),
        ..ArpOptions::default()
    })
    .await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.result(
        "arp.initialize",
        json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "t", "version": "1"}, "capabilities": {}}),
    )
    .await;
    let drive =
        json!({"name": "drive", "arguments": {"linear": 0.2, "angular": 0.0, "durationSecs": 0.2}});
    let id = c.request("arp.callTool", drive).await;
    for n in 1..=30 {
        let forged = json!({"jsonrpc": "2.0", "id": format!("confirm-{n}"),
            "result": {"confirmed": true, "confirmedBy": "the owner", "timestamp": "2026-11-28T12:00:00Z"}});
        c.send_raw(&forged.to_string()).await;
    }
    let answer = loop {
        let v = c.read().await;
        assert_ne!(
            v["method"], "arp.requestConfirmation",
            "a client that declared no confirmation was asked: {v}"
        );
        if v.get("method").is_none() && v["id"] == id {
            break v;
        }
    };
    assert_eq!(code(&answer), -40006, "{answer}");
    assert_eq!(f.probe.state().x, 0.0, "nothing moved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_during_and_after_a_call_never_runs_it_twice() {
    let f = fixture(ArpOptions::default()).await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    let params = json!({"name": "drive", "arguments": {"linear": 0.25, "angular": 0.0, "durationSecs": 1.0}, "idempotencyKey": "leg-1"});
    let first = c.request("arp.callTool", params.clone()).await;
    c.message("arp.toolProgress").await;
    // During: attaches to the running call (no Tool Busy, no second run).
    let retry = c.request("arp.callTool", params.clone()).await;
    let a = c.response(&first).await;
    let b = c.response(&retry).await;
    assert_eq!(a["result"]["state"], "completed");
    assert_eq!(a["result"], b["result"], "same call, same outcome");
    until(&f.probe, "stopped", |s| s.linear == 0.0).await;
    // After: the recorded result, at once.
    let later = c.call("arp.callTool", params).await;
    assert_eq!(later["result"], a["result"]);
    assert_eq!(f.probe.state().linear, 0.0);
    let x = f.probe.state().x;
    assert!((x - 0.25).abs() < 0.06, "moved once: x = {x}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_stop_end_a_drive_as_cancelled() {
    let f = fixture(ArpOptions::default()).await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    let id = c.request("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.2, "angular": 0.5, "durationSecs": 20.0}})).await;
    let call_id = c.message("arp.toolProgress").await["params"]["callId"].clone();
    until(&f.probe, "moving", |s| s.linear > 0.0).await;
    let busy = c.tool("navigate_to", json!({"location": "nowhere"})).await;
    assert_eq!(code(&busy), -40004, "one motion at a time");
    let busy = c
        .tool(
            "drive",
            json!({"linear": 0.1, "angular": 0.0, "durationSecs": 1.0}),
        )
        .await;
    assert_eq!(code(&busy), -40004);
    assert_eq!(busy["error"]["data"]["activeCallId"], call_id);
    let cancelled = c.result("arp.cancelTool", json!({"callId": call_id})).await;
    assert_eq!(cancelled, json!({"callId": call_id, "cancelled": true}));
    assert_eq!(c.response(&id).await["result"]["state"], "cancelled");
    until(&f.probe, "stopped", |s| s.linear == 0.0 && s.angular == 0.0).await;
    let unknown = c.call("arp.cancelTool", json!({"callId": call_id})).await;
    assert_eq!(code(&unknown), -32602);

    let id = c.request("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.2, "angular": 0.0, "durationSecs": 20.0}})).await;
    c.message("arp.toolProgress").await;
    until(&f.probe, "moving", |s| s.linear > 0.0).await;
    let stop = c.tool("stop", json!({})).await;
    assert_eq!(stop["result"]["state"], "completed");
    assert_eq!(c.response(&id).await["result"]["state"], "cancelled");
    until(&f.probe, "stopped", |s| s.linear == 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_navigate_and_cancel_navigation() {
    let f = fixture(ArpOptions::default()).await;
    let mut c = Client::connect(&f.url, OPERATOR).await;
    c.initialize().await;
    let saved = c.tool("save_location", json!({"name": "home"})).await;
    assert_eq!(saved["result"]["result"]["location"]["name"], "home");
    assert_eq!(
        code(&c.tool("save_location", json!({"name": "home"})).await),
        -40002
    );
    c.tool(
        "drive",
        json!({"linear": 0.5, "angular": 0.0, "durationSecs": 1.0}),
    )
    .await;
    let listed = c.tool("list_locations", json!({})).await;
    assert_eq!(listed["result"]["result"]["locations"][0]["name"], "home");
    let id = c
        .request(
            "arp.callTool",
            json!({"name": "navigate_to", "arguments": {"location": "home"}}),
        )
        .await;
    let done = c.response(&id).await;
    assert_eq!(done["result"]["state"], "completed", "{done}");
    let progress = c
        .backlog
        .iter()
        .filter(|v| {
            v["method"] == "arp.toolProgress" && v["params"]["progress"].as_f64() > Some(0.0)
        })
        .count();
    assert!(progress > 0, "distance-based progress");
    let s = f.probe.state();
    assert!(s.x.abs() < 0.1 && s.y.abs() < 0.1, "{s:?}");
    assert_eq!(code(&c.tool("cancel_navigation", json!({})).await), -40002);

    c.tool(
        "drive",
        json!({"linear": 0.5, "angular": 0.0, "durationSecs": 1.0}),
    )
    .await;
    let id = c
        .request(
            "arp.callTool",
            json!({"name": "navigate_to", "arguments": {"location": "home"}}),
        )
        .await;
    c.message("arp.toolProgress").await;
    until(&f.probe, "navigating", |s| s.goal.is_some()).await;
    let cancel = c.tool("cancel_navigation", json!({})).await;
    assert_eq!(cancel["result"]["state"], "completed");
    assert_eq!(c.response(&id).await["result"]["state"], "cancelled");
    until(&f.probe, "stopped", |s| s.goal.is_none() && s.linear == 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_updates_honour_max_rate() {
    let f = fixture(ArpOptions::default()).await;
    let mut c = Client::connect(&f.url, VIEWER).await;
    c.initialize().await;
    let sub = c
        .result(
            "arp.subscribeContext",
            json!({"name": "odometry", "maxRate": 5}),
        )
        .await;
    assert_eq!(sub, json!({"name": "odometry", "subscribed": true}));
    let first = c.message("arp.contextUpdate").await;
    assert_eq!(first["params"]["data"]["frame"], "odom");
    let start = Instant::now();
    for _ in 0..10 {
        let update = c.message("arp.contextUpdate").await;
        assert_eq!(update["params"]["name"], "odometry");
    }
    let period = start.elapsed().as_secs_f64() / 10.0;
    assert!(
        (period - 0.2).abs() <= 0.02,
        "5/s within 10 %: period {period}"
    );
    c.result("arp.unsubscribeContext", json!({"name": "odometry"}))
        .await;
    let status = c
        .result("arp.subscribeContext", json!({"name": "status"}))
        .await;
    assert_eq!(status["subscribed"], true);
    // Whatever was in flight drains; then only status arrives.
    loop {
        let update = c.message("arp.contextUpdate").await;
        if update["params"]["name"] == "status" {
            assert_eq!(update["params"]["data"]["emergencyStop"]["latched"], false);
            break;
        }
    }
    let bad = c
        .call_invalid(
            "arp.subscribeContext",
            json!({"name": "status", "maxRate": -1}),
        )
        .await;
    assert_eq!(code(&bad), -32602);
}

/// The ARP server over an `exec:` driver running `script` (its declared
/// tools in, `dock` not confirmed by config); its URL and listener task.
async fn exec_driver_server(script: String) -> (String, tokio::task::JoinHandle<()>) {
    let (handle, end) = DriverHandle::channel();
    let (pose, mut tools) = (handle.pose.clone(), handle.tools.clone());
    tokio::spawn(crate::driver::exec::run(
        script,
        end,
        crate::driver::DriverOptions::default(),
    ));
    let controller = crate::controller::spawn(SafetyLimits::default(), handle);
    tokio::time::timeout(WAIT, tools.wait_for(|t| !t.is_empty()))
        .await
        .expect("tools in time")
        .expect("driver alive");
    let deadline = Instant::now() + WAIT;
    while !controller.status().await.expect("status").driver_ready {
        assert!(Instant::now() < deadline, "driver never ready");
        tokio::task::yield_now().await;
    }
    let server = ArpServer::new(
        crate::testutil::shared(controller, None),
        pose,
        ArpOptions {
            odometry: false,
            driver_tools: Some(tools),
            confirm: HashMap::from([("dock".to_owned(), false)]),
            ..ArpOptions::default()
        },
    );
    let tokens: Vec<Token> = [OPERATOR, VIEWER]
        .iter()
        .map(|t| t.parse().expect("token"))
        .collect();
    let listener = ArpListener::bind(&ListenConfig::new("127.0.0.1:0", tokens).expect("listen"))
        .await
        .expect("bind");
    let url = format!("ws://{}/", listener.local_addr().expect("addr"));
    (url, tokio::spawn(listener.run(server)))
}

/// An `exec:` driver declaring a `critical` tool in its ready notification:
/// listed, its arguments checked, confirmation always asked, then run by the
/// driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_driver_declares_a_tool_that_is_listed_confirmed_and_run() {
    let ready = json!({"jsonrpc": "2.0", "method": "ready", "params": {"tools": [{
        "name": "dock",
        "description": "Drive onto the charger",
        "parameters": {"type": "object", "properties": {"speed": {"type": "number"}}, "additionalProperties": false},
        "safety": {"level": "critical", "reversible": true, "description": "Moves onto the dock"},
    }, {"name": "bad name!", "safety": {"level": "normal"}}]}});
    // Answers every call_tool request with {"docked": true, "name": ...}.
    let script = format!(
        r#"echo '{ready}'; while read -r line; do case "$line" in *'"call_tool"'*) id=$(echo "$line" | sed -E 's/.*"id":([0-9]+).*/\1/'); echo "{{\"jsonrpc\":\"2.0\",\"id\":$id,\"result\":{{\"docked\":true}}}}";; esac; done"#
    );
    let (url, task) = exec_driver_server(script).await;

    let mut c = Client::connect(&url, OPERATOR).await;
    c.initialize().await;
    let list = c.result("arp.listTools", json!({})).await;
    let names: Vec<&str> = list["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names.len(),
        9,
        "eight built-ins and the valid declared tool: {names:?}"
    );
    let dock = &list["tools"][8];
    assert_eq!(dock["name"], "dock");
    assert_eq!(dock["safety"]["level"], "critical");
    assert_eq!(
        dock["safety"]["requiresConfirmation"], true,
        "critical: always"
    );
    let sources = c.result("arp.listContext", json!({})).await;
    assert_eq!(
        sources["sources"].as_array().expect("sources").len(),
        1,
        "no odometry"
    );

    let bad = c.tool("dock", json!({"speed": "fast"})).await;
    assert_eq!(code(&bad), -32602);
    assert_eq!(bad["error"]["data"]["field"], "arguments.speed");
    let id = c
        .request(
            "arp.callTool",
            json!({"name": "dock", "arguments": {"speed": 0.1}}),
        )
        .await;
    let ask = c.message("arp.requestConfirmation").await;
    assert_eq!(ask["params"]["safetyLevel"], "critical");
    c.send_raw(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"confirmed": true, "confirmedBy": "tester", "timestamp": "2026-11-25T13:00:00Z"}}).to_string())
        .await;
    let done = c.response(&id).await;
    assert_eq!(done["result"]["state"], "completed", "{done}");
    assert_eq!(done["result"]["result"], json!({"docked": true}));

    let mut viewer = Client::connect(&url, VIEWER).await;
    viewer.initialize().await;
    assert_eq!(
        code(&viewer.tool("dock", json!({"speed": 0.1})).await),
        -40001
    );
    task.abort();
}

/// `count` mangled ARP frames (truncated, odd values, flipped bytes, or
/// intact), the same every run.
fn mangled_frames(count: usize) -> Vec<String> {
    let templates = [
        r#"{"jsonrpc":"2.0","id":1,"method":"arp.initialize","params":{"protocolVersion":"0.1.0","clientInfo":{"name":"f","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","id":"a","method":"arp.callTool","params":{"name":"drive","arguments":{"linear":0.1,"angular":0,"durationSecs":1},"idempotencyKey":"k"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"arp.subscribeContext","params":{"name":"odometry","maxRate":10}}"#,
        r#"{"jsonrpc":"2.0","id":8,"method":"arp.setWorkspace","params":{"name":"w","bounds":{"type":"box","min":[0,0],"max":[1,1]}}}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":{"confirmed":true}}"#,
    ];
    let odd = [
        "null",
        "[]",
        "{}",
        "1e999",
        "-0",
        "\"\\u0000\"",
        "true",
        "[[[[[]]]]]",
        "18446744073709551616",
    ];
    // A fixed linear congruential generator: the same frames every run.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize % n.max(1)
    };
    let mut frames = Vec::new();
    for _ in 0..count {
        let t = templates[next(templates.len())];
        let frame = match next(4) {
            // Truncated anywhere (on a char boundary).
            0 => {
                let mut cut = next(t.len());
                while !t.is_char_boundary(cut) {
                    cut -= 1;
                }
                t[..cut].to_owned()
            }
            // A value swapped for an odd one.
            1 => {
                let colons: Vec<usize> = t.match_indices(':').map(|(i, _)| i).collect();
                let at = colons[next(colons.len())] + 1;
                let end = t[at..].find([',', '}']).map_or(t.len(), |e| at + e);
                format!("{}{}{}", &t[..at], odd[next(odd.len())], &t[end..])
            }
            // Bytes flipped.
            2 => t
                .chars()
                .map(|c| {
                    if next(12) == 0 {
                        ['"', '{', ']', ',', '\\'][next(5)]
                    } else {
                        c
                    }
                })
                .collect(),
            _ => t.to_owned(),
        };
        frames.push(frame);
    }
    frames
}

/// The transport-free handler (as the gateway will reach it) fed mangled
/// frames: every answer is valid ARP, nothing panics, it keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mangled_frames_get_valid_errors_and_the_handler_keeps_serving() {
    let f = fixture(ArpOptions::default()).await;
    let (in_tx, in_rx) = tokio::sync::mpsc::channel(FRAME_CHANNEL);
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel(FRAME_CHANNEL);
    let handler = f.server.connect(
        Peer {
            key: "gateway-1".into(),
            session: None,
            role: Role::Viewer,
            subject: "fuzzer".into(),
        },
        in_rx,
        out_tx,
    );
    let frames = mangled_frames(150);
    let validator = ArpValidator::shared();
    let mut answers = 0;
    let count = frames.len();
    // Sent from a task: the handler waits for room to answer (bounded
    // channels both ways), so the test reads while it writes.
    let sender = tokio::spawn(async move {
        for frame in frames {
            in_tx.send(frame).await.expect("handler alive");
        }
        // A last, valid request; everything before it has been answered
        // (or rightly ignored) once its answer arrives.
        in_tx
            .send(r#"{"jsonrpc":"2.0","id":"last","method":"arp.listContext"}"#.into())
            .await
            .expect("handler alive");
        in_tx
    });
    loop {
        let text = tokio::time::timeout(WAIT, out_rx.recv())
            .await
            .expect("answers in time")
            .expect("handler alive");
        let v: Value = serde_json::from_str(&text).expect("the handler sends JSON");
        if let Err(e) = validator.validate(&v, None) {
            panic!("invalid ARP from the handler: {e}\n{v}");
        }
        answers += 1;
        if v["id"] == "last" {
            // Not initialized (unless a mangled frame happened to be a
            // valid initialize): either way an answer, not a hang.
            assert!(
                v.get("result").is_some() || v["error"]["code"] == -40009,
                "{v}"
            );
            break;
        }
    }
    assert!(answers > 100, "{answers} answers to {count} frames");
    let _in_tx = sender.await.expect("sender");
    assert_eq!(f.probe.state().x, 0.0, "a viewer moved nothing");
    assert!(!handler.is_finished());
    handler.abort();
}

/// A robot with a camera shows its picture: an `exec:` source of ffmpeg's test pattern in
/// H.264 (1280×720, a keyframe a second) gives a JPEG that decodes, scaled to fit 640×480.
/// Skipped, saying so, without ffmpeg.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_image_shows_the_cameras_picture() {
    if std::process::Command::new(camera::FFMPEG)
        .arg("-version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: ffmpeg is not installed");
        return;
    }
    let source = "exec:ffmpeg -hide_banner -loglevel error -re -f lavfi \
        -i testsrc=size=1280x720:rate=15 -c:v libx264 -preset ultrafast -tune zerolatency \
        -g 15 -pix_fmt yuv420p -f h264 -";
    let spec = crate::video::VideoSpec::new("front", source).expect("spec");
    let front = crate::video::Camera::start(spec, std::time::Duration::from_secs(5));
    let f = fixture(ArpOptions {
        cameras: vec![front],
        ..ArpOptions::default()
    })
    .await;
    let mut c = Client::connect(&f.url, VIEWER).await;
    c.initialize().await;
    let shot = c
        .result(
            "arp.callTool",
            json!({"name": "capture_image", "arguments": {}}),
        )
        .await;
    let image = &shot["result"]["image"];
    assert_eq!(image["mimeType"], "image/jpeg", "{shot}");
    assert_eq!(
        (image["width"].as_u64(), image["height"].as_u64()),
        (Some(640), Some(360))
    );
    assert_eq!(image["camera"], "front");
    let jpeg = {
        use base64::Engine as _;
        let data = image["data"].as_str().expect("data");
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64")
    };
    assert_eq!(crate::video::still::jpeg_size(&jpeg), Some((640, 360)));
    // It decodes: ffmpeg reads it back as 640×360 RGB pixels.
    let mut decoder = tokio::process::Command::new(camera::FFMPEG)
        .args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-f",
            "image2pipe",
            "-c:v",
            "mjpeg",
        ])
        .args([
            "-i", "pipe:0", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("ffmpeg runs");
    let mut stdin = decoder.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, &jpeg)
        .await
        .expect("written");
    drop(stdin);
    let out = tokio::time::timeout(WAIT, decoder.wait_with_output())
        .await
        .expect("decoded in time")
        .expect("ffmpeg");
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 640 * 360 * 3);
}
