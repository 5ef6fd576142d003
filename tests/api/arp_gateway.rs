//! The ARP gateway (`/v1/robots/{id}/arp`) over real sockets: a program on one side, a robot
//! that declared ARP on the other (answering as a test peer, every frame it receives checked
//! against docs/protocol.md and the ARP schema, every frame the program receives against the
//! ARP schema with the method it answers).

use std::collections::HashMap;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use signalling_protocol::arp::FRAME_SIGNATURE_KEY;
use signalling_protocol::arp_schema::ArpValidator;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::helpers::*;

/// A program on the gateway.
pub struct ArpClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Methods of requests sent, by id, to validate their answers.
    asked: HashMap<String, String>,
    next_id: u64,
    /// Connected with `?signed=`: frames may carry the robot's `signature`.
    signed: bool,
}

/// What the upgrade answered when it was refused.
pub async fn arp_refused(server: &TestServer, robot_id: &str, token: Option<&str>) -> u16 {
    let url = server
        .ws_url()
        .replace("/ws", &format!("/v1/robots/{robot_id}/arp"));
    let mut request = url.into_client_request().expect("request");
    if let Some(token) = token {
        request.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        other => panic!(
            "the upgrade was not refused: {:?}",
            other.map(|(_, r)| r.status())
        ),
    }
}

impl ArpClient {
    pub async fn connect(server: &TestServer, robot_id: &str, token: &str) -> ArpClient {
        let url = server
            .ws_url()
            .replace("/ws", &format!("/v1/robots/{robot_id}/arp"));
        Self::connect_to(&url, token).await
    }

    /// A program on the gateway at `url` (`ws://host/v1/robots/{id}/arp`).
    pub async fn connect_to(url: &str, token: &str) -> ArpClient {
        let mut request = url.into_client_request().expect("request");
        request.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
        );
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("connect in time")
            .expect("upgrade");
        ArpClient {
            ws,
            asked: HashMap::new(),
            next_id: 0,
            signed: url.contains("signed="),
        }
    }

    /// Sends a request; returns its id.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = json!(self.next_id);
        self.asked.insert(id.to_string(), method.to_string());
        let frame = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.send_text(frame.to_string()).await;
        id
    }

    pub async fn send_text(&mut self, text: String) {
        self.ws
            .send(Message::Text(text.into()))
            .await
            .expect("send");
    }

    /// The next frame, validated against the ARP schema (an answer with its method).
    pub async fn recv(&mut self) -> Value {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame in time")
                .expect("the socket is open")
                .expect("a frame");
            let Message::Text(text) = message else {
                if let Message::Close(close) = message {
                    panic!("closed while waiting for a frame: {close:?}");
                }
                continue;
            };
            let value: Value = serde_json::from_str(text.as_str()).expect("JSON");
            let answered = value
                .get("id")
                .filter(|_| value.get("method").is_none())
                .and_then(|id| self.asked.get(&id.to_string()))
                .cloned();
            // A program that asked for the robot's signatures gets them as one more member.
            let mut bare = value.clone();
            if self.signed {
                bare.as_object_mut().map(|f| f.remove(FRAME_SIGNATURE_KEY));
            }
            if let Err(e) = ArpValidator::shared().validate(&bare, answered.as_deref()) {
                panic!("the gateway sent a frame that breaks the ARP schema: {e}\n{value}");
            }
            return value;
        }
    }

    /// The answer to `id`, skipping notifications.
    pub async fn answer(&mut self, id: &Value) -> Value {
        loop {
            let frame = self.recv().await;
            if frame.get("method").is_none() && &frame["id"] == id {
                return frame;
            }
        }
    }

    /// The close frame's code, after any frames still on their way.
    pub async fn closed(&mut self) -> (u16, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("closed in time");
            match message {
                Some(Ok(Message::Text(text))) => {
                    before.push(serde_json::from_str(text.as_str()).expect("JSON"))
                }
                Some(Ok(Message::Close(Some(close)))) => return (close.code.into(), before),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return (0, before),
            }
        }
    }
}

/// A robot that declared ARP, logged in at `ws_url` with `key`.
pub async fn arp_robot_at(ws_url: &str, robot_id: &str, key: &dyn Signer) -> WsClient {
    let mut robot = WsClient::connect(ws_url).await;
    let verified = robot
        .try_prove_with(robot_id, key, json!({ "arp": "0.1.0" }))
        .await;
    assert_eq!(verified["type"], "signalling.pki_verified", "{verified}");
    robot.recv_type("signalling.welcome").await;
    robot
}

/// A robot that declared ARP, logged in.
pub async fn arp_robot(server: &TestServer, robot_id: &str) -> WsClient {
    let key = server.enrolled_robot(robot_id).await;
    let mut robot = WsClient::connect(&server.ws_url()).await;
    let verified = robot
        .try_prove_with(robot_id, &key, json!({ "arp": "0.1.0" }))
        .await;
    assert_eq!(verified["type"], "signalling.pki_verified", "{verified}");
    robot.recv_type("signalling.welcome").await;
    robot
}

/// The robot's side: the next `arp.frame`'s connection id and frame.
pub async fn robot_frame(robot: &mut WsClient) -> (String, Value, Value) {
    let message = robot.recv_type("arp.frame").await;
    let connection = message["payload"]["connectionId"]
        .as_str()
        .expect("connectionId")
        .to_string();
    // The signed ticket is checked in tickets.rs; here, who the server says calls.
    let mut session = message["meta"]["session"].clone();
    if let Some(ticket) = session.as_object_mut().and_then(|s| s.remove("ticket")) {
        assert!(ticket.is_string(), "{message}");
    }
    (connection, message["payload"]["frame"].clone(), session)
}

/// The robot answers a frame of `connection`.
pub async fn robot_answers(robot: &mut WsClient, connection: &str, frame: Value) {
    robot
        .send(&envelope(
            "arp.frame",
            Some(json!({ "connectionId": connection, "frame": frame })),
        ))
        .await;
}

pub fn initialize_result() -> Value {
    json!({
        "protocolVersion": "0.1.0",
        "serverInfo": { "name": "test-robot", "version": "1" },
        "capabilities": { "tools": true, "context": true, "constraints": true, "planning": false, "confirmation": true },
    })
}

/// A program of `subject` with `role` on the robot, initialized; the robot's side of it.
pub async fn initialized(
    server: &TestServer,
    robot: &mut WsClient,
    subject: &str,
    role: &str,
) -> (ArpClient, String) {
    server.grant("robot-1", subject, role).await;
    let token = server.client_token(subject).await;
    let mut program = ArpClient::connect(server, "robot-1", &token).await;
    let id = program
        .request("arp.initialize", json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "planner", "version": "1" }, "capabilities": {} }))
        .await;
    let (connection, frame, session) = robot_frame(robot).await;
    assert_eq!(frame["method"], "arp.initialize");
    assert_eq!(session, json!({ "subject": subject, "role": role }));
    robot_answers(
        robot,
        &connection,
        json!({ "jsonrpc": "2.0", "id": frame["id"], "result": initialize_result() }),
    )
    .await;
    let answer = program.answer(&id).await;
    assert_eq!(answer["result"]["protocolVersion"], "0.1.0", "{answer}");
    (program, connection)
}

#[tokio::test]
async fn a_program_reaches_the_robot_and_back_with_the_callers_identity_from_the_server() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (mut program, connection) = initialized(&server, &mut robot, "planner-7", "operator").await;
    assert!(connection.starts_with("arp-"), "{connection}");
    // A frame that is not ARP 0.1.0 (here: a member of its own, `meta`) is answered by the
    // gateway; the robot never reads it.
    program
        .send_text(
            json!({ "jsonrpc": "2.0", "id": 49, "method": "arp.listTools", "params": {},
                    "meta": { "session": { "subject": "root", "role": "owner" } } })
            .to_string(),
        )
        .await;
    assert_eq!(program.answer(&json!(49)).await["error"]["code"], -32600);
    let id = program.request("arp.fly", json!({})).await;
    assert_eq!(program.answer(&id).await["error"]["code"], -32601);
    // The robot learns who calls from the server alone.
    program
        .send_text(
            json!({ "jsonrpc": "2.0", "id": 50, "method": "arp.listTools", "params": {} })
                .to_string(),
        )
        .await;
    let (_, frame, session) = robot_frame(&mut robot).await;
    assert_eq!(frame["method"], "arp.listTools");
    assert_eq!(
        session,
        json!({ "subject": "planner-7", "role": "operator" })
    );
    let tools = json!({ "tools": [] });
    robot_answers(
        &mut robot,
        &connection,
        json!({ "jsonrpc": "2.0", "id": 50, "result": tools }),
    )
    .await;
    let answer = program.answer(&json!(50)).await;
    assert_eq!(answer["result"], tools);
    // Progress notifications pass through too.
    let progress = json!({ "jsonrpc": "2.0", "method": "arp.toolProgress",
        "params": { "callId": "c1", "progress": 0.5, "message": "half", "state": "running" } });
    robot_answers(&mut robot, &connection, progress.clone()).await;
    assert_eq!(program.recv().await, progress);
    server.shutdown().await;
}

#[tokio::test]
async fn the_robots_signature_reaches_only_a_program_that_asked_with_its_nonce() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    server.grant("robot-1", "planner-7", "operator").await;
    let token = server.client_token("planner-7").await;
    let url = server.ws_url().replace("/ws", "/v1/robots/robot-1/arp");
    let initialize = json!({ "protocolVersion": "0.1.0",
        "clientInfo": { "name": "planner", "version": "1" }, "capabilities": {} });
    let signature = "eyJhbGciOiJFZERTQSJ9..c2lnbmVk";
    for nonce in [Some("the-programs-nonce_42"), None] {
        let query = nonce.map_or(String::new(), |n| format!("?signed={n}"));
        let mut program = ArpClient::connect_to(&format!("{url}{query}"), &token).await;
        let id = program.request("arp.initialize", initialize.clone()).await;
        let message = robot.recv_type("arp.frame").await;
        // The robot is told the nonce to sign for, by the server, on every frame.
        assert_eq!(
            message["meta"]
                .get("signatureNonce")
                .and_then(Value::as_str),
            nonce,
            "{message}"
        );
        let connection = message["payload"]["connectionId"].clone();
        let frame = &message["payload"]["frame"];
        let answer = json!({ "jsonrpc": "2.0", "id": frame["id"], "result": initialize_result() });
        let mut signed = envelope(
            "arp.frame",
            Some(json!({ "connectionId": connection, "frame": answer })),
        );
        signed["meta"] = json!({ "signature": signature });
        robot.send(&signed).await;
        let received = program.answer(&id).await;
        assert_eq!(received["result"], initialize_result());
        // Passed on as the frame's own member to the program that asked; a program that
        // did not gets the frame exactly as ARP has it.
        let expected = nonce.map(|_| signature);
        assert_eq!(
            received.get(FRAME_SIGNATURE_KEY).and_then(Value::as_str),
            expected,
            "{received}"
        );
        drop(program);
        robot.recv_type("signalling.disconnected").await;
    }
    server.shutdown().await;
}

#[tokio::test]
async fn the_upgrade_needs_a_token_and_a_grant() {
    let server = TestServer::start().await;
    server.create_robot("robot-1").await;
    assert_eq!(arp_refused(&server, "robot-1", None).await, 401);
    let token = server.client_token("stranger").await;
    assert_eq!(arp_refused(&server, "robot-1", Some(&token)).await, 403);
    assert_eq!(
        arp_refused(&server, "robot-1", Some("sct_not-a-token")).await,
        401
    );
    server.shutdown().await;
}

/// Browsers let any page open a WebSocket to any address, token and all (and under DNS
/// rebinding with the page's own name in `Host`): a page from an origin not allowed is
/// refused 403, in the API's JSON error shape, before the token or the grant is looked at
/// and before any ARP exchange, as on the MCP endpoint. The listed origin
/// (`--allow-origin`), the server's own address (a page using the SDK it serves at `/sdk/`)
/// and programs (no `Origin`) pass.
#[tokio::test]
async fn a_web_page_of_another_origin_is_refused_before_any_arp_exchange() {
    const ALLOWED: &str = "https://console.example.com";
    let server = TestServer::start_with(|c| c.allow_origins = vec![ALLOWED.into()]).await;
    server.create_robot("robot-1").await;
    let token = server.client_token("planner").await;
    server.grant("robot-1", "planner", "operator").await;
    let url = server.ws_url().replace("/ws", "/v1/robots/robot-1/arp");
    let upgrade = |origin: Option<&str>, host: Option<&str>, token: Option<&str>| {
        let mut request = url.as_str().into_client_request().expect("request");
        let headers = request.headers_mut();
        if let Some(origin) = origin {
            headers.insert("origin", HeaderValue::from_str(origin).expect("header"));
        }
        if let Some(host) = host {
            headers.insert("host", HeaderValue::from_str(host).expect("header"));
        }
        if let Some(token) = token {
            let bearer = HeaderValue::from_str(&format!("Bearer {token}")).expect("header");
            headers.insert("authorization", bearer);
        }
        async move { tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request)).await }
    };
    for (origin, host, token) in [
        ("https://evil.example", None, Some(token.as_str())),
        ("https://evil.example", None, None),
        ("null", None, Some(token.as_str())),
        ("http://127.0.0.2:1", None, Some(token.as_str())),
        // Rebinding: the attacker's name in Host too is no "own origin".
        (
            "http://rebind.evil.example",
            Some("rebind.evil.example"),
            Some(token.as_str()),
        ),
    ] {
        let answer = upgrade(Some(origin), host, token).await.expect("in time");
        let Err(tokio_tungstenite::tungstenite::Error::Http(refused)) = answer else {
            panic!("a page from {origin} was let in");
        };
        assert_eq!(refused.status(), 403, "{origin}");
        let body: Value =
            serde_json::from_slice(refused.body().as_deref().unwrap_or_default()).expect("JSON");
        assert_eq!(body["error"], "FORBIDDEN", "{body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("origin")),
            "{body}"
        );
    }
    let own = format!("http://{}", server.addr);
    for origin in [Some(ALLOWED), Some(own.as_str()), None] {
        let answer = upgrade(origin, None, Some(&token)).await.expect("in time");
        let (_, response) = answer.unwrap_or_else(|e| panic!("{origin:?} refused: {e}"));
        assert_eq!(response.status(), 101, "{origin:?}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn an_offline_robot_is_said_at_initialize_not_a_hang() {
    let server = TestServer::start().await;
    server.create_robot("robot-1").await;
    server.grant("robot-1", "planner", "operator").await;
    let token = server.client_token("planner").await;
    let mut program = ArpClient::connect(&server, "robot-1", &token).await;
    let id = program
        .request("arp.initialize", json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "planner", "version": "1" }, "capabilities": {} }))
        .await;
    let answer = program.answer(&id).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "robot_offline");
    // Anything else before a session: not initialized.
    let id = program.request("arp.listTools", json!({})).await;
    assert_eq!(program.answer(&id).await["error"]["code"], -40009);
    server.shutdown().await;
}

#[tokio::test]
async fn a_robot_that_did_not_declare_arp_never_receives_a_frame() {
    let server = TestServer::start().await;
    let (mut robot, _key) = server.online_robot("robot-1").await;
    server.grant("robot-1", "planner", "owner").await;
    let token = server.client_token("planner").await;
    let mut program = ArpClient::connect(&server, "robot-1", &token).await;
    let id = program
        .request("arp.initialize", json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "planner", "version": "1" }, "capabilities": {} }))
        .await;
    let answer = program.answer(&id).await;
    assert_eq!(
        answer["error"]["data"]["reason"], "arp_unsupported",
        "{answer}"
    );
    robot.expect_nothing_pending().await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_viewer_reads_and_stops_but_never_drives() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (mut program, connection) = initialized(&server, &mut robot, "watcher", "viewer").await;
    let refused = [
        ("arp.callTool", json!({ "name": "drive", "arguments": {} })),
        ("arp.cancelTool", json!({ "callId": "c1" })),
    ];
    for (method, params) in refused {
        let id = program.request(method, params).await;
        let answer = program.answer(&id).await;
        assert_eq!(answer["error"]["code"], -40001, "{answer}");
        assert_eq!(answer["error"]["data"]["reason"], "forbidden");
    }
    robot.expect_nothing_pending().await;
    // Anyone may stop the robot.
    let id = program
        .request(
            "arp.emergencyStop",
            json!({ "reason": "a person in the way" }),
        )
        .await;
    let (on, frame, session) = robot_frame(&mut robot).await;
    assert_eq!(
        (on.as_str(), frame["method"].as_str()),
        (connection.as_str(), Some("arp.emergencyStop"))
    );
    assert_eq!(session["role"], "viewer");
    robot_answers(
        &mut robot,
        &connection,
        json!({ "jsonrpc": "2.0", "id": id, "result": { "stopped": true } }),
    )
    .await;
    assert_eq!(program.answer(&id).await["result"]["stopped"], true);
    server.shutdown().await;
}

#[tokio::test]
async fn one_controller_programs_and_people_alike() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (_program, _) = initialized(&server, &mut robot, "planner", "operator").await;
    // A second program, and a person, find the robot busy.
    server.grant("robot-1", "other", "operator").await;
    let token = server.client_token("other").await;
    let mut other = ArpClient::connect(&server, "robot-1", &token).await;
    let id = other
        .request("arp.initialize", json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "planner", "version": "1" }, "capabilities": {} }))
        .await;
    let answer = other.answer(&id).await;
    assert_eq!(answer["error"]["code"], -40004, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "robot_busy");
    let mut person = server.client_for("robot-1", "alice", "operator").await;
    person.send(&offer("robot-1", "s-alice")).await;
    let refused = person.expect_error("FORBIDDEN").await;
    assert_eq!(refused["payload"]["details"]["reason"], "robot_busy");
    robot.expect_nothing_pending().await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_grant_removed_mid_call_cuts_the_program_off_and_tells_the_robot() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (mut program, connection) = initialized(&server, &mut robot, "planner", "operator").await;
    let call = program
        .request("arp.callTool", json!({ "name": "drive", "arguments": { "linear": 0.2, "angular": 0.0, "durationSecs": 5 } }))
        .await;
    let (_, frame, _) = robot_frame(&mut robot).await;
    assert_eq!(frame["method"], "arp.callTool");
    let (status, _) = server
        .admin(
            reqwest::Method::DELETE,
            "/v1/robots/robot-1/grants/planner",
            None,
        )
        .await;
    assert_eq!(status, 204);
    // The robot hears the session end (and stops: robot-agent's rule); the program gets
    // an answer for its call and the socket closes.
    let end = robot.recv_type("signalling.disconnected").await;
    assert_eq!(end["payload"]["connectionId"], connection.as_str());
    let (code, before) = program.closed().await;
    assert_eq!(code, 1000);
    let answer = before
        .iter()
        .find(|f| f["id"] == call)
        .expect("the call answered");
    assert_eq!(
        answer["error"]["data"]["reason"], "session_ended",
        "{answer}"
    );
    assert_eq!(answer["error"]["data"]["cause"], "grant_revoked");
    server.shutdown().await;
}

#[tokio::test]
async fn teleop_and_arp_messages_stay_in_their_own_sessions() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (_program, connection) = initialized(&server, &mut robot, "planner", "viewer").await;
    // The robot answering an ARP session with WebRTC signalling is refused.
    robot
        .send(&envelope(
            "signalling.answer",
            Some(json!({ "connectionId": connection, "sdp": "v=0\r\n", "sdpType": "answer" })),
        ))
        .await;
    let refused = robot.expect_error("FORBIDDEN").await;
    assert_eq!(
        refused["payload"]["details"]["reason"],
        "wrong_session_kind"
    );
    // A browser client cannot send arp.frame.
    let mut person = server.client_for("robot-1", "alice", "viewer").await;
    person
        .send(&envelope(
            "arp.frame",
            Some(json!({ "connectionId": connection, "frame": { "jsonrpc": "2.0", "method": "arp.emergencyStop" } })),
        ))
        .await;
    person.expect_error("FORBIDDEN").await;
    robot.expect_nothing_pending().await;
    server.shutdown().await;
}

#[tokio::test]
async fn calls_are_limited_and_on_record() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (mut program, connection) = initialized(&server, &mut robot, "planner", "operator").await;
    let first = program
        .request(
            "arp.callTool",
            json!({ "name": "drive", "arguments": { "linear": 0.1 }, "idempotencyKey": "k-1" }),
        )
        .await;
    let (_, frame, _) = robot_frame(&mut robot).await;
    robot_answers(
        &mut robot,
        &connection,
        json!({ "jsonrpc": "2.0", "id": frame["id"],
        "result": { "callId": "c1", "state": "completed", "result": {} } }),
    )
    .await;
    assert_eq!(program.answer(&first).await["result"]["state"], "completed");
    // Sixteen calls running at once; the seventeenth is refused by the gateway.
    let mut ids = Vec::new();
    for _ in 0..16 {
        ids.push(
            program
                .request("arp.callTool", json!({ "name": "stop", "arguments": {} }))
                .await,
        );
    }
    let over = program
        .request("arp.callTool", json!({ "name": "stop", "arguments": {} }))
        .await;
    let answer = program.answer(&over).await;
    assert_eq!(
        answer["error"]["data"]["reason"], "rate_limited",
        "{answer}"
    );
    // The completed call is on record, with its caller, tool, key and outcome.
    // Written by the node's audit writer, a moment after the answer: poll, bounded.
    let deadline = tokio::time::Instant::now() + WAIT;
    let page = loop {
        let (status, page) = server
            .admin(reqwest::Method::GET, "/v1/robots/robot-1/audit", None)
            .await;
        assert_eq!(status, 200, "{page}");
        // The request is on record (`pending`) before the call runs; its outcome follows.
        let first = page["records"].as_array().and_then(|r| r.first());
        if first.is_some_and(|r| r["outcome"] != "pending") {
            break page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no audit record in time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let record = &page["records"][0];
    assert_eq!(record["subject"], "planner");
    assert_eq!(record["role"], "operator");
    assert_eq!(record["tool"], "drive");
    assert_eq!(record["outcome"], "completed");
    assert_eq!(record["idempotencyKey"], "k-1");
    assert_eq!(record["sessionId"], connection.as_str());
    drop(ids);
    server.shutdown().await;
}

/// GET or POST with a client token.
pub async fn as_client(
    server: &TestServer,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, server.url(path))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("HTTP");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The confirmations `token`'s person sees, once there are `count`.
pub async fn confirmations(server: &TestServer, token: &str, count: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, list) = as_client(
            server,
            token,
            reqwest::Method::GET,
            "/v1/confirmations",
            None,
        )
        .await;
        assert_eq!(status, 200, "{list}");
        let list = list.as_array().cloned().unwrap_or_default();
        if list.len() == count {
            return list;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{count} confirmations never came: {list:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn people_approve_what_the_robot_marks_critical_and_the_first_answer_wins() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (mut program, connection) = initialized(&server, &mut robot, "planner", "operator").await;
    server.grant("robot-1", "alice", "owner").await;
    server.grant("robot-1", "bob", "operator").await;
    server.grant("robot-1", "vic", "viewer").await;
    let alice = server.client_token("alice").await;
    let bob = server.client_token("bob").await;
    let vic = server.client_token("vic").await;
    let planner = server.client_token("planner").await;
    let call = program
        .request(
            "arp.callTool",
            json!({ "name": "navigate_to", "arguments": { "location": "dock" } }),
        )
        .await;
    let (_, frame, _) = robot_frame(&mut robot).await;
    // The robot asks; the program did not declare confirmation: people are asked.
    let ask = json!({ "jsonrpc": "2.0", "id": "confirm-1", "method": "arp.requestConfirmation",
        "params": { "action": "navigate_to dock", "safetyLevel": "elevated",
                    "details": { "tool": "navigate_to", "arguments": { "location": "dock" } }, "timeout": 30 } });
    robot_answers(&mut robot, &connection, ask).await;
    let seen = confirmations(&server, &alice, 1).await;
    assert_eq!(seen[0]["requestedBy"], "planner");
    assert_eq!(seen[0]["tool"], "navigate_to");
    assert_eq!(seen[0]["safetyLevel"], "elevated");
    assert_eq!(
        confirmations(&server, &vic, 0).await.len(),
        0,
        "a viewer is not asked"
    );
    let id = seen[0]["id"].as_str().expect("id").to_string();
    let path = format!("/v1/confirmations/{id}");
    // The program cannot approve itself, a viewer cannot approve at all.
    let post = reqwest::Method::POST;
    let yes = Some(json!({ "confirmed": true }));
    assert_eq!(
        as_client(&server, &planner, post.clone(), &path, yes.clone())
            .await
            .0,
        403
    );
    assert_eq!(
        as_client(&server, &vic, post.clone(), &path, yes.clone())
            .await
            .0,
        403
    );
    // An operator is no one to approve a critical call (the robot's owners are).
    assert_eq!(
        as_client(&server, &bob, post.clone(), &path, yes.clone())
            .await
            .0,
        403
    );
    let (status, answered) = as_client(&server, &alice, post.clone(), &path, yes.clone()).await;
    assert_eq!(
        (status, &answered["confirmedBy"]),
        (200, &json!("alice")),
        "{answered}"
    );
    // Olga, another owner, is second: too late.
    server.grant("robot-1", "olga", "owner").await;
    let olga = server.client_token("olga").await;
    let no = Some(json!({ "confirmed": false }));
    assert_eq!(as_client(&server, &olga, post, &path, no).await.0, 409);
    let (_, reply, _) = robot_frame(&mut robot).await;
    assert_eq!(reply["id"], "confirm-1");
    assert_eq!(reply["result"]["confirmed"], true);
    assert_eq!(reply["result"]["confirmedBy"], "alice");
    robot_answers(
        &mut robot,
        &connection,
        json!({ "jsonrpc": "2.0", "id": frame["id"],
        "result": { "callId": "c9", "state": "completed", "result": {} } }),
    )
    .await;
    assert_eq!(program.answer(&call).await["result"]["state"], "completed");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, page) = server
            .admin(
                reqwest::Method::GET,
                "/v1/robots/robot-1/audit?format=json",
                None,
            )
            .await;
        let first = page["records"].as_array().and_then(|r| r.first());
        if let Some(record) = first.filter(|r| r["outcome"] != "pending") {
            assert_eq!(record["confirmedBy"], "alice", "{record}");
            assert_eq!(record["subject"], "planner");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no audit record");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_person_denies_and_the_robot_hears_no() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (_program, connection) = initialized(&server, &mut robot, "planner", "operator").await;
    server.grant("robot-1", "alice", "owner").await;
    let alice = server.client_token("alice").await;
    let ask = json!({ "jsonrpc": "2.0", "id": 7, "method": "arp.requestConfirmation",
        "params": { "action": "drive", "safetyLevel": "elevated",
                    "details": { "tool": "drive", "arguments": {} }, "timeout": 30 } });
    robot_answers(&mut robot, &connection, ask).await;
    let seen = confirmations(&server, &alice, 1).await;
    let path = format!("/v1/confirmations/{}", seen[0]["id"].as_str().expect("id"));
    let (status, _) = as_client(
        &server,
        &alice,
        reqwest::Method::POST,
        &path,
        Some(json!({ "confirmed": false })),
    )
    .await;
    assert_eq!(status, 200);
    let (_, reply, _) = robot_frame(&mut robot).await;
    assert_eq!(
        reply["result"],
        json!({ "confirmed": false, "confirmedBy": "alice", "timestamp": reply["result"]["timestamp"] })
    );
    server.shutdown().await;
}

#[tokio::test]
async fn owners_and_the_admin_stop_a_robot_from_the_api_on_record() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    server.grant("robot-1", "alice", "owner").await;
    server.grant("robot-1", "bob", "operator").await;
    let alice = server.client_token("alice").await;
    let bob = server.client_token("bob").await;
    let post = reqwest::Method::POST;
    let path = "/v1/robots/robot-1/emergency-stop";
    assert_eq!(
        as_client(&server, &bob, post.clone(), path, None).await.0,
        403
    );
    let (status, body) = as_client(&server, &alice, post, path, None).await;
    assert_eq!(status, 202, "{body}");
    let message = robot.recv_type("arp.frame").await;
    assert_eq!(message["payload"]["frame"]["method"], "arp.emergencyStop");
    assert_eq!(message["meta"]["session"]["subject"], "alice");
    let end = robot.recv_type("signalling.disconnected").await;
    assert_eq!(
        end["payload"]["connectionId"],
        message["payload"]["connectionId"]
    );
    let (status, _) = server.admin(reqwest::Method::POST, path, None).await;
    assert_eq!(status, 202);
    robot.recv_type("arp.frame").await;
    // A robot that does not serve ARP, and an offline one: 409.
    let (_plain, _key) = server.online_robot("robot-2").await;
    assert_eq!(
        server
            .admin(
                reqwest::Method::POST,
                "/v1/robots/robot-2/emergency-stop",
                None
            )
            .await
            .0,
        409
    );
    server.create_robot("robot-3").await;
    assert_eq!(
        server
            .admin(
                reqwest::Method::POST,
                "/v1/robots/robot-3/emergency-stop",
                None
            )
            .await
            .0,
        409
    );
    // Both stops are on record; the export is one JSON record per line.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let export = reqwest::Client::new()
            .get(server.url("/v1/robots/robot-1/audit?format=jsonl"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("export");
        assert_eq!(export.headers()["content-type"], "application/x-ndjson");
        let text = export.text().await.expect("body");
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        if records.len() == 2 {
            let by: Vec<_> = records
                .iter()
                .map(|r| (r["action"].clone(), r["subject"].clone()))
                .collect();
            assert_eq!(
                by,
                [
                    (json!("emergency_stop"), json!("alice")),
                    (json!("emergency_stop"), json!("admin"))
                ]
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "records: {text}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    server.shutdown().await;
}

/// `arp.initialize` with `takeover: true`, by `subject` (granted `role`); the answer or
/// the robot's side of it.
async fn initialize_taking_over(
    server: &TestServer,
    subject: &str,
    role: &str,
) -> (ArpClient, Value) {
    server.grant("robot-1", subject, role).await;
    let token = server.client_token(subject).await;
    let mut program = ArpClient::connect(server, "robot-1", &token).await;
    let id = program
        .request(
            "arp.initialize",
            json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": subject, "version": "1" },
                    "capabilities": {}, "takeover": true }),
        )
        .await;
    (program, id)
}

#[tokio::test]
async fn an_owner_takes_over_from_a_program_and_the_robot_stops_first() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    let (mut operator, old) = initialized(&server, &mut robot, "planner", "operator").await;
    let call = operator
        .request(
            "arp.callTool",
            json!({ "name": "drive", "arguments": { "linear": 0.2 } }),
        )
        .await;
    robot_frame(&mut robot).await;
    // An operator cannot take over; an owner can.
    let (mut other, id) = initialize_taking_over(&server, "other", "operator").await;
    assert_eq!(
        other.answer(&id).await["error"]["data"]["reason"],
        "robot_busy"
    );
    let (mut owner, id) = initialize_taking_over(&server, "boss", "owner").await;
    // The robot hears the controller's session end before anything of the new one.
    let end = robot.recv().await;
    assert_eq!(end["type"], "signalling.disconnected", "{end}");
    assert_eq!(end["payload"]["connectionId"], old.as_str());
    assert_eq!(end["payload"]["details"]["reason"], "preempted");
    let (connection, frame, session) = robot_frame(&mut robot).await;
    assert_eq!(frame["method"], "arp.initialize");
    assert!(
        frame["params"].get("takeover").is_none(),
        "takeover is the gateway's: {frame}"
    );
    assert_eq!(session, json!({ "subject": "boss", "role": "owner" }));
    robot_answers(
        &mut robot,
        &connection,
        json!({ "jsonrpc": "2.0", "id": frame["id"], "result": initialize_result() }),
    )
    .await;
    assert_eq!(
        owner.answer(&id).await["result"]["protocolVersion"],
        "0.1.0"
    );
    let (code, before) = operator.closed().await;
    assert_eq!(code, 1000);
    let answer = before
        .iter()
        .find(|f| f["id"] == call)
        .expect("the call answered");
    assert_eq!(answer["error"]["data"]["cause"], "preempted", "{answer}");
    // The takeover is on record.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, page) = server
            .admin(reqwest::Method::GET, "/v1/robots/robot-1/audit", None)
            .await;
        let records = page["records"].as_array().cloned().unwrap_or_default();
        if let Some(record) = records.iter().find(|r| r["action"] == "takeover") {
            assert_eq!(record["subject"], "boss");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no takeover record: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    server.shutdown().await;
}

#[tokio::test]
async fn people_and_programs_take_over_from_each_other_by_the_same_rule() {
    let server = TestServer::start().await;
    let mut robot = arp_robot(&server, "robot-1").await;
    // A person drives; an owner's program takes over.
    let (mut person, session) = server
        .open_session(&mut robot, "robot-1", "alice", "operator")
        .await;
    let (_owner, _) = initialize_taking_over(&server, "boss", "owner").await;
    let end = person.recv_type("signalling.disconnected").await;
    assert_eq!(end["payload"]["connectionId"], session.as_str());
    assert_eq!(end["payload"]["details"]["reason"], "preempted");
    let end = robot.recv_type("signalling.disconnected").await;
    assert_eq!(end["payload"]["connectionId"], session.as_str());
    let (program_session, frame, _) = robot_frame(&mut robot).await;
    assert_eq!(frame["method"], "arp.initialize");
    // An owner in a browser takes over from the program: `meta.takeover` on the offer.
    let mut owner = server.client_for("robot-1", "carol", "owner").await;
    let mut take = offer("robot-1", &owner.connection_id.clone());
    take["meta"] = json!({ "takeover": true });
    owner.send(&take).await;
    let end = robot.recv_type("signalling.disconnected").await;
    assert_eq!(end["payload"]["connectionId"], program_session.as_str());
    assert_eq!(end["payload"]["details"]["reason"], "preempted");
    let forwarded = robot.recv_type("signalling.offer").await;
    assert_eq!(forwarded["meta"]["session"]["subject"], "carol");
    assert!(forwarded["meta"].get("takeover").is_none(), "{forwarded}");
    // Without the word, an owner finds the robot busy as before.
    let mut other_owner = server.client_for("robot-1", "dave", "owner").await;
    let session = other_owner.connection_id.clone();
    other_owner.send(&offer("robot-1", &session)).await;
    let refused = other_owner.expect_error("FORBIDDEN").await;
    assert_eq!(refused["payload"]["details"]["reason"], "robot_busy");
    server.shutdown().await;
}
