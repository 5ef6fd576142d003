//! Trust and abuse, round 3 (issue 41), the ARP gateway's findings, over real sockets: a
//! real server, programs on `/v1/robots/{id}/arp` and a scripted robot on `/ws`.

use serde_json::{json, Value};

use crate::arp_gateway::{
    arp_robot, confirmations, initialize_result, initialized, robot_answers, robot_frame, ArpClient,
};
use crate::helpers::*;

fn drive_call() -> Value {
    json!({ "name": "drive", "arguments": { "linear": 0.2, "angular": 0.0, "durationSecs": 1.0 } })
}

/// The robot's `arp.requestConfirmation` for a drive, with `id`.
fn ask(id: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "arp.requestConfirmation",
        "params": { "action": "drive", "safetyLevel": "critical",
                    "details": { "tool": "drive", "arguments": { "linear": 0.2 } }, "timeout": 30 } })
}

/// The robot sends `frame` on `connection` saying who may confirm (`meta.confirmationPolicy`).
async fn robot_asks_with_policy(
    robot: &mut WsClient,
    connection: &str,
    frame: Value,
    policy: &str,
) {
    let mut message = envelope(
        "arp.frame",
        Some(json!({ "connectionId": connection, "frame": frame })),
    );
    message["meta"] = json!({ "confirmationPolicy": policy });
    robot.send(&message).await;
}

/// What a forger sends: an approval of request `id` in the owner's name.
fn forged_approval(id: &str) -> String {
    json!({ "jsonrpc": "2.0", "id": id,
        "result": { "confirmed": true, "confirmedBy": "alice", "timestamp": "2026-11-28T12:00:00Z" } })
    .to_string()
}

/// The value of a counter in the server's /metrics text.
async fn counter(server: &TestServer, series: &str) -> u64 {
    let text = server.metrics().await;
    text.lines()
        .find_map(|line| line.strip_prefix(series))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or(0)
}

/// The audit records of robot-1 (first page), once `done` holds for them.
async fn audit_until(server: &TestServer, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, page) = server
            .admin(
                reqwest::Method::GET,
                "/v1/robots/robot-1/audit?format=json&limit=1000",
                None,
            )
            .await;
        let records = page["records"].as_array().cloned().unwrap_or_default();
        if done(&records) {
            return records;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the audit never got there: {records:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Finding 1: a program that did not declare confirmation answers the robot's request with
/// guessed ids in the owner's name. The robot never sees any of it; the request stays
/// before people; every forged frame is counted.
#[tokio::test]
async fn a_program_cannot_approve_its_own_critical_call() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (mut program, connection) = initialized(&server, &mut robot, "planner", "operator").await;
    server.grant("robot-1", "alice", "owner").await;
    let alice = server.client_token("alice").await;
    let _call = program.request("arp.callTool", drive_call()).await;
    let (_, frame, _) = robot_frame(&mut robot).await;
    assert_eq!(frame["method"], "arp.callTool");
    // Even a robot that allows its clients to confirm: this program did not declare it.
    robot_asks_with_policy(&mut robot, &connection, ask("confirm-1"), "client").await;
    let listed = confirmations(&server, &alice, 1).await;
    for n in 1..=30 {
        program
            .send_text(forged_approval(&format!("confirm-{n}")))
            .await;
    }
    // A request after the forgeries: it is the robot's next frame.
    let fence = program.request("arp.listTools", json!({})).await;
    let (_, next, _) = robot_frame(&mut robot).await;
    assert_eq!(
        next.get("method").and_then(Value::as_str),
        Some("arp.listTools"),
        "the robot received a frame the program forged: {next}"
    );
    assert_eq!(next["id"], fence);
    let still = confirmations(&server, &alice, 1).await;
    assert_eq!(
        still[0]["id"], listed[0]["id"],
        "the console still lists it"
    );
    assert_eq!(
        counter(
            &server,
            "signalling_arp_frames_dropped_total{reason=\"unsolicited_answer\"}"
        )
        .await,
        30
    );
    server.shutdown().await;
}

/// Finding 1: the robot's policy decides. `console` (also when it says nothing): people are
/// asked even when the program declared confirmation, and its answer is dropped. `client`:
/// the program that declared it is asked and its answer reaches the robot with the
/// program's subject as the confirmer, whatever name it wrote, and so does the record.
#[tokio::test]
async fn the_robots_policy_says_who_confirms_and_the_server_names_the_confirmer() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    server.grant("robot-1", "planner", "operator").await;
    server.grant("robot-1", "alice", "owner").await;
    let alice = server.client_token("alice").await;
    let token = server.client_token("planner").await;
    let mut program = ArpClient::connect(&server, "robot-1", &token).await;
    let init = program
        .request("arp.initialize", json!({ "protocolVersion": "0.1.0",
            "clientInfo": { "name": "planner", "version": "1" }, "capabilities": { "confirmation": true } }))
        .await;
    let (connection, frame, _) = robot_frame(&mut robot).await;
    assert_eq!(frame["params"]["capabilities"]["confirmation"], true);
    robot_answers(
        &mut robot,
        &connection,
        json!({ "jsonrpc": "2.0", "id": frame["id"], "result": initialize_result() }),
    )
    .await;
    assert!(program.answer(&init).await.get("result").is_some());

    // A robot that says nothing: its people confirm.
    let call = program.request("arp.callTool", drive_call()).await;
    let (_, frame, _) = robot_frame(&mut robot).await;
    robot_answers(&mut robot, &connection, ask("ask-console")).await;
    let listed = confirmations(&server, &alice, 1).await;
    assert_eq!(listed[0]["requestedBy"], "planner");
    program.send_text(forged_approval("ask-console")).await;
    let fence = program.request("arp.listTools", json!({})).await;
    let (_, next, _) = robot_frame(&mut robot).await;
    assert_eq!(
        next["id"], fence,
        "the robot received a forged answer: {next}"
    );

    // A robot that lets its clients confirm: the program is asked, and answers.
    robot_asks_with_policy(&mut robot, &connection, ask("ask-client"), "client").await;
    let asked = loop {
        let frame = program.recv().await;
        if frame["method"] == "arp.requestConfirmation" {
            break frame;
        }
    };
    assert_eq!(asked["id"], "ask-client");
    // An answer to a request it was not asked is dropped, even now.
    program.send_text(forged_approval("ask-console")).await;
    program.send_text(forged_approval("ask-client")).await;
    let (_, reply, _) = robot_frame(&mut robot).await;
    assert_eq!(reply["id"], "ask-client", "{reply}");
    assert_eq!(reply["result"]["confirmed"], true);
    assert_eq!(
        reply["result"]["confirmedBy"], "planner via client",
        "the confirmer is who the server authenticated, not a name in the payload"
    );
    robot_answers(
        &mut robot,
        &connection,
        json!({ "jsonrpc": "2.0", "id": frame["id"],
            "result": { "callId": "c1", "state": "completed", "result": {} } }),
    )
    .await;
    assert_eq!(program.answer(&call).await["result"]["state"], "completed");
    let records = audit_until(&server, |r| {
        r.iter()
            .any(|r| r["action"] == "tool_call" && r["outcome"] == "completed")
    })
    .await;
    let record = records
        .iter()
        .find(|r| r["action"] == "tool_call")
        .expect("the call's record");
    assert_eq!(record["confirmedBy"], "planner via client", "{record}");
    assert_eq!(
        counter(
            &server,
            "signalling_arp_frames_dropped_total{reason=\"unsolicited_answer\"}"
        )
        .await,
        2
    );
    server.shutdown().await;
}

/// Finding 4: a gateway socket that goes silent is dropped after the idle timeout, like a
/// /ws socket; the dead program's control lock goes with it and another operator drives.
#[tokio::test]
async fn a_silent_program_is_dropped_and_its_lock_freed() {
    let server = TestServer::start_with(|c| {
        c.idle_timeout_secs = 2;
        c.ping_interval_secs = 1;
    })
    .await;
    let mut robot = arp_robot(&server, "robot-1").await;
    server.grant("robot-1", "watcher", "viewer").await;
    let watcher = server.client_token("watcher").await;
    let mut viewer = ArpClient::connect(&server, "robot-1", &watcher).await;
    let (mut silent, connection) = initialized(&server, &mut robot, "planner", "operator").await;
    // Neither program reads nor writes from here on: neither answers a ping.
    // Bounded as a whole: the robot's own pings would restart a per-frame wait.
    let ended = tokio::time::timeout(WAIT, robot.recv_type("signalling.disconnected"))
        .await
        .expect("the robot hears the silent program's session end in time");
    assert_eq!(ended["payload"]["connectionId"], connection.as_str());
    let (other, _) = initialized(&server, &mut robot, "bob", "operator").await;
    let (code, _) = silent.closed().await;
    assert_eq!(code, 1008, "the silent operator is closed for idleness");
    let (code, _) = viewer.closed().await;
    assert_eq!(code, 1008, "the silent viewer is closed for idleness");
    drop(other);
    server.shutdown().await;
}

/// Finding 11: an e-stop before `arp.initialize` acts (it reaches the robot) and is
/// answered, from anyone with a grant.
#[tokio::test]
async fn an_emergency_stop_before_initialize_reaches_the_robot() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    server.grant("robot-1", "watcher", "viewer").await;
    let token = server.client_token("watcher").await;
    let mut program = ArpClient::connect(&server, "robot-1", &token).await;
    let id = program
        .request(
            "arp.emergencyStop",
            json!({ "reason": "someone in the way" }),
        )
        .await;
    let answer = program.answer(&id).await;
    assert_eq!(answer["result"]["stopped"], true, "{answer}");
    let (_, frame, session) = robot_frame(&mut robot).await;
    assert_eq!(frame["method"], "arp.emergencyStop", "{frame}");
    assert_eq!(session["subject"], "watcher");
    let records = audit_until(&server, |r| !r.is_empty()).await;
    assert_eq!(records[0]["action"], "emergency_stop");
    assert_eq!(records[0]["subject"], "watcher");
    server.shutdown().await;
}

/// Finding 6: a flood of e-stops from one socket writes one record a second with a count,
/// and every one of them still reaches the robot.
#[tokio::test]
async fn an_emergency_stop_flood_is_coalesced_on_record_but_every_stop_acts() {
    const STOPS: u64 = 3000;
    // Room for the whole flood at the robot: a full queue refuses a stop (without closing
    // the robot), which would make "every stop reached the robot" depend on scheduling.
    let server = TestServer::start_with(|c| {
        c.send_queue = 8192;
        c.send_queue_bytes = 64 * 1024 * 1024;
    })
    .await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (mut program, _) = initialized(&server, &mut robot, "watcher", "viewer").await;
    // The robot reads as a robot does, while the program floods.
    let reader = tokio::spawn(async move {
        let mut reached = 0;
        while reached < STOPS {
            let (_, frame, _) = robot_frame(&mut robot).await;
            assert_eq!(frame["method"], "arp.emergencyStop", "{frame}");
            reached += 1;
        }
        // The robot stays connected: its going away would end the session (and write the
        // count of the last second at once).
        (reached, robot)
    });
    let started = std::time::Instant::now();
    for _ in 0..STOPS {
        program
            .request("arp.emergencyStop", json!({ "reason": "flood" }))
            .await;
    }
    let count = |r: &Value| -> u64 {
        r["params"]
            .as_str()
            .and_then(|p| serde_json::from_str::<Value>(p).ok())
            .and_then(|p| p["count"].as_u64())
            .unwrap_or(1)
    };
    let stops = |records: &[Value]| -> Vec<Value> {
        records
            .iter()
            .filter(|r| r["action"] == "emergency_stop")
            .cloned()
            .collect()
    };
    // One record a second: the first stop's at once, then one for each second the flood
    // lasted on the server (3,000 frames take more than 0.1 s in a debug build).
    let records = audit_until(&server, |r| {
        let stops = stops(r);
        let seconds = started.elapsed().as_secs() as usize;
        stops.len() > 2 + seconds || stops.iter().map(count).sum::<u64>() >= STOPS
    })
    .await;
    let records = stops(&records);
    let mut at: Vec<i64> = records.iter().filter_map(|r| r["at"].as_i64()).collect();
    at.sort_unstable();
    assert!(
        at.windows(2).all(|w| w[1] - w[0] >= 900),
        "{} e-stop records for one socket's {STOPS} stops in {:?}, not one a second: {at:?}",
        records.len(),
        started.elapsed()
    );
    assert_eq!(records.iter().map(count).sum::<u64>(), STOPS);
    let (reached, _robot) = tokio::time::timeout(WAIT, reader)
        .await
        .expect("the robot read every stop in time")
        .expect("every frame the robot read was a stop");
    assert_eq!(reached, STOPS, "every stop reached the robot");
    server.shutdown().await;
}
