//! The remote MCP endpoint (`/v1/robots/{id}/mcp`, Streamable HTTP), end to end: the real
//! server (SQLite) and the real robot-agent (sim driver) enrolled and online. Plain HTTP
//! here (what any host sends); `the_official_mcp_sdk_drives_the_robot` runs the official
//! MCP Python SDK (`pip install mcp`) against the same, and says SKIPPED without it.

use std::time::{Duration, Instant};

use agent_server_tests::server::{self, Running};
use serde_json::{json, Value};
use signalling_protocol::arp::ConfirmationPolicy;

#[path = "../../arp-bridge/tests/support/python.rs"]
mod python;

const ADMIN: &str = "mcp-endpoint-admin";
const ROBOT: &str = "robot-mcp-1";
/// The one browser origin the server is told to let in (`--allow-origin`).
const ALLOWED_ORIGIN: &str = "https://console.example.com";

struct Tokens {
    operator: String,
    viewer: String,
    /// A valid token of a subject with no grant on the robot.
    stranger: String,
}

async fn robot_online() -> (Running, Tokens, tokio::task::AbortHandle) {
    let running = server::start(ADMIN, |config, _| {
        config.allow_origins = vec![ALLOWED_ORIGIN.into()];
    })
    .await;
    let (config_dir, _) = running.enroll(ROBOT).await;
    let operator = running
        .client_token(ROBOT, "mcp-operator", "operator")
        .await;
    let viewer = running.client_token(ROBOT, "mcp-viewer", "viewer").await;
    let made = running
        .admin(
            reqwest::Method::POST,
            "/v1/tokens",
            Some(json!({ "subject": "mcp-stranger" })),
        )
        .await;
    let stranger = made["token"].as_str().expect("token").to_string();
    // save_location asks a person first, and the client may answer (elicitation).
    let agent = running.agent(ROBOT, config_dir, |c| {
        c.arp.confirm.policy = ConfirmationPolicy::Client;
        c.arp.confirm.tools.insert("save_location".into(), true);
    });
    running.wait_online(ROBOT).await;
    let tokens = Tokens {
        operator,
        viewer,
        stranger,
    };
    (running, tokens, agent.abort_handle())
}

fn url(running: &Running) -> String {
    format!("{}/v1/robots/{ROBOT}/mcp", running.base)
}

/// One MCP client session over plain HTTP.
struct Client<'a> {
    running: &'a Running,
    token: String,
    session: Option<String>,
    next: u64,
}

impl<'a> Client<'a> {
    fn new(running: &'a Running, token: &str) -> Client<'a> {
        Client {
            running,
            token: token.to_string(),
            session: None,
            next: 1,
        }
    }

    async fn post(&self, body: Value) -> reqwest::Response {
        self.post_accepting(body, "application/json, text/event-stream")
            .await
    }

    async fn post_accepting(&self, body: Value, accept: &str) -> reqwest::Response {
        let mut request = self
            .running
            .http
            .post(url(self.running))
            .bearer_auth(&self.token)
            .header("accept", accept)
            .json(&body);
        if let Some(session) = &self.session {
            request = request
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-06-18");
        }
        tokio::time::timeout(Duration::from_secs(40), request.send())
            .await
            .expect("an answer in time")
            .expect("HTTP")
    }

    /// A request; its JSON-RPC answer (in JSON, or the last event of its SSE stream).
    async fn ask(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response = self.post(body).await;
        assert_eq!(response.status(), 200, "{method}");
        if method == "initialize" {
            self.session = response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
        }
        let answer = if is_sse(&response) {
            let mut events = Events::new(response);
            loop {
                let (_, message) = events.next().await.expect("the answer before the end");
                if message.get("method").is_none() {
                    break message;
                }
            }
        } else {
            response.json().await.expect("JSON")
        };
        assert_eq!(answer["id"], json!(id), "{answer}");
        answer
    }

    async fn initialize(&mut self) -> Value {
        self.initialize_with(json!({})).await
    }

    /// `initialize` declaring `capabilities`.
    async fn initialize_with(&mut self, capabilities: Value) -> Value {
        let answer = self
            .ask(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": capabilities,
                    "clientInfo": { "name": "mcp_endpoint.rs", "version": "0" },
                }),
            )
            .await;
        assert!(self.session.is_some(), "no Mcp-Session-Id: {answer}");
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        assert_eq!(self.post(note).await.status(), 202);
        answer
    }

    async fn call(&mut self, name: &str, arguments: Value) -> Value {
        let answer = self
            .ask(
                "tools/call",
                json!({ "name": name, "arguments": arguments }),
            )
            .await;
        answer["result"].clone()
    }

    async fn odometry_x(&mut self) -> f64 {
        let read = self
            .ask("resources/read", json!({ "uri": "arp://context/odometry" }))
            .await;
        let text = read["result"]["contents"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("no pose: {read}"));
        let update: Value = serde_json::from_str(text).expect("JSON");
        update["data"]["position"]["x"].as_f64().expect("x")
    }
}

fn is_sse(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The events of an SSE response, as they come.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    fn new(response: reqwest::Response) -> Events {
        assert!(is_sse(&response), "{:?}", response.headers());
        Events {
            response,
            buffer: String::new(),
        }
    }

    /// The next event's id and message; `None` once the stream has ended.
    async fn next(&mut self) -> Option<(Option<String>, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut id = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                // A keep-alive comment carries no message.
                if !data.is_empty() {
                    return Some((id, serde_json::from_str(&data).expect("JSON")));
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(40), self.response.chunk())
                .await
                .expect("an event in time")
                .expect("HTTP")?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_refuses_before_any_mcp_exchange() {
    let (running, tokens, agent) = robot_online().await;
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "t", "version": "0" } },
    });
    let anonymous = running
        .http
        .post(url(&running))
        .json(&init)
        .send()
        .await
        .expect("HTTP");
    assert_eq!(anonymous.status(), 401);
    let bad = Client::new(&running, "not-a-token")
        .post(init.clone())
        .await;
    assert_eq!(bad.status(), 401);
    let stranger = Client::new(&running, &tokens.stranger)
        .post(init.clone())
        .await;
    assert_eq!(stranger.status(), 403);
    // Anything but initialize needs a session; an unknown one is 404.
    let mut operator = Client::new(&running, &tokens.operator);
    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" });
    assert_eq!(operator.post(list.clone()).await.status(), 400);
    operator.session = Some("no-such-session".into());
    assert_eq!(operator.post(list.clone()).await.status(), 404);
    // Another subject's session is as unknown as none.
    let mut viewer = Client::new(&running, &tokens.viewer);
    viewer.initialize().await;
    operator.session = viewer.session.clone();
    assert_eq!(operator.post(list).await.status(), 404);
    agent.abort();
}

/// DNS rebinding (MCP's Streamable HTTP transport: servers MUST validate `Origin`): a web
/// page's request from an origin not allowed is 403, in the API's JSON error shape, before
/// the token is even looked at; the listed origin, the server's own address and programs
/// (no `Origin`) pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_of_another_origin_is_refused() {
    let (running, tokens, agent) = robot_online().await;
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "t", "version": "0" } },
    });
    let send = |method: reqwest::Method, origin: Option<&str>, token: Option<&str>| {
        let mut request = running
            .http
            .request(method, url(&running))
            .header("accept", "application/json, text/event-stream")
            .json(&init);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move {
            tokio::time::timeout(Duration::from_secs(40), request.send())
                .await
                .expect("an answer in time")
                .expect("HTTP")
        }
    };
    let post = reqwest::Method::POST;
    let operator = Some(tokens.operator.as_str());
    for (method, origin, token) in [
        (post.clone(), "https://evil.example", operator),
        (post.clone(), "https://evil.example", None),
        (post.clone(), "null", operator),
        (reqwest::Method::GET, "https://evil.example", operator),
        (reqwest::Method::DELETE, "http://127.0.0.2:1", operator),
    ] {
        let refused = send(method.clone(), Some(origin), token).await;
        assert_eq!(refused.status(), 403, "{method} from {origin}");
        let body: Value = refused.json().await.expect("a JSON body");
        assert_eq!(body["error"], "FORBIDDEN", "{body}");
        assert!(body["message"]
            .as_str()
            .is_some_and(|m| m.contains("origin")));
    }
    // Rebinding proper: the attacker's name in Host too is no "own origin".
    let rebound = running
        .http
        .post(url(&running))
        .header("host", "rebind.evil.example")
        .header("origin", "http://rebind.evil.example")
        .bearer_auth(&tokens.operator)
        .json(&init)
        .send()
        .await
        .expect("HTTP");
    assert_eq!(rebound.status(), 403);
    // Let in: the listed origin, the server's own address, and no Origin at all. (The
    // viewer's sessions: viewers take no control lock.)
    let own = running.base.clone();
    for origin in [Some(ALLOWED_ORIGIN), Some(own.as_str()), None] {
        let viewer = Some(tokens.viewer.as_str());
        let answer = send(post.clone(), origin, viewer).await;
        assert_eq!(answer.status(), 200, "from {origin:?}");
        assert!(answer.headers().contains_key("mcp-session-id"));
        let body: Value = answer.json().await.expect("JSON");
        assert_eq!(body["result"]["protocolVersion"], "2025-06-18", "{body}");
    }
    agent.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_drives_and_a_viewer_is_refused_motion() {
    let (running, tokens, agent) = robot_online().await;
    let mut operator = Client::new(&running, &tokens.operator);
    let init = operator.initialize().await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert!(
        init["result"]["capabilities"]["tools"].is_object(),
        "{init}"
    );

    lists_the_robots_tools_and_context(&mut operator).await;

    let before = operator.odometry_x().await;
    let drive = json!({ "linear": 0.3, "angular": 0.0, "durationSecs": 0.5 });
    let driven = operator.call("drive", drive.clone()).await;
    assert_eq!(driven["isError"], false, "{driven}");
    assert_eq!(
        driven["structuredContent"]["state"], "completed",
        "{driven}"
    );
    let after = operator.odometry_x().await;
    assert!(after > before + 0.05, "the sim moved: {before} -> {after}");

    captures_a_jpeg(&mut operator).await;
    a_keyed_retry_runs_once(&mut operator, &drive, after).await;

    // A viewer may read and stop, never move.
    let mut viewer = Client::new(&running, &tokens.viewer);
    viewer.initialize().await;
    let refused = viewer.call("drive", drive).await;
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(refused["structuredContent"]["error"]["code"], -40001);
    assert_eq!(
        refused["structuredContent"]["error"]["data"]["reason"],
        "forbidden"
    );

    // The drive is on record like any program's, with the MCP session's connection.
    let drives = audited(&running, "drive", "mcp-operator", 3).await;
    // The keyed retry is on record as a replay, the first run as a call.
    let actions: Vec<&str> = drives.iter().filter_map(|r| r["action"].as_str()).collect();
    assert_eq!(
        actions.iter().filter(|a| **a == "tool_call_replay").count(),
        1,
        "{drives:?}"
    );
    assert!(
        drives[0]["sessionId"]
            .as_str()
            .is_some_and(|s| s.starts_with("mcp-")),
        "{drives:?}"
    );

    delete_ends_the_session(&running, &tokens.operator, &mut operator).await;
    agent.abort();
}

/// MCP's Streamable HTTP: a tool call of a client that takes SSE is answered on a stream of
/// its own, carrying the question of its confirmation (`elicitation/create`) and then its
/// answer, so a client with no `GET` stream open is asked too. Declined there, the call
/// fails (-40006). A client that takes JSON only gets JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_streams_its_question_and_then_its_answer() {
    let (running, tokens, agent) = robot_online().await;
    let mut operator = Client::new(&running, &tokens.operator);
    operator.initialize_with(json!({ "elicitation": {} })).await;
    let call = json!({
        "jsonrpc": "2.0", "id": "save-1", "method": "tools/call",
        "params": { "name": "save_location", "arguments": { "name": "dock" } },
    });
    let response = operator.post(call).await;
    assert_eq!(response.status(), 200);
    let mut events = Events::new(response);
    let (asked_id, asked) = events.next().await.expect("the question");
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    assert!(asked_id.is_some(), "events have ids");
    let decline = json!({ "jsonrpc": "2.0", "id": asked["id"], "result": { "action": "decline" } });
    assert_eq!(operator.post(decline).await.status(), 202);
    let (_, answer) = events.next().await.expect("the answer");
    assert_eq!(answer["id"], "save-1", "{answer}");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["error"]["code"], -40006,
        "{answer}"
    );
    assert!(
        events.next().await.is_none(),
        "the stream ends with the answer"
    );

    let listing = json!({
        "jsonrpc": "2.0", "id": 60, "method": "tools/call",
        "params": { "name": "list_locations", "arguments": {} },
    });
    let json_only = operator.post_accepting(listing, "application/json").await;
    assert!(!is_sse(&json_only));
    let answer: Value = json_only.json().await.expect("JSON");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    agent.abort();
}

/// A client that lost a call's stream resumes it (`GET` with `Last-Event-ID`): the events
/// it missed, then the rest as they come, then the answer, and the stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stream_resumes_from_its_last_event_id() {
    let (running, tokens, agent) = robot_online().await;
    let mut operator = Client::new(&running, &tokens.operator);
    operator.initialize().await;
    let drive = json!({
        "jsonrpc": "2.0", "id": 70, "method": "tools/call",
        "params": {
            "name": "drive",
            "arguments": { "linear": 0.2, "angular": 0.0, "durationSecs": 1.0 },
            "_meta": { "progressToken": "p-70" },
        },
    });
    let mut events = Events::new(operator.post(drive).await);
    let (last_id, first) = events.next().await.expect("progress");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    assert_eq!(first["params"]["progressToken"], "p-70");
    let first_progress = first["params"]["progress"].as_f64().expect("progress");
    // The connection goes, with the rest of the call's events.
    drop(events);
    let resumed = running
        .http
        .get(url(&running))
        .bearer_auth(&tokens.operator)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", operator.session.clone().expect("session"))
        .header("last-event-id", last_id.expect("an event id"))
        .send()
        .await
        .expect("HTTP");
    assert_eq!(resumed.status(), 200);
    let mut events = Events::new(resumed);
    let mut progress = vec![first_progress];
    let answer = loop {
        let (_, message) = events.next().await.expect("the answer before the end");
        if message["method"] == "notifications/progress" {
            progress.push(message["params"]["progress"].as_f64().expect("progress"));
        } else {
            break message;
        }
    };
    assert_eq!(answer["id"], 70, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["state"], "completed",
        "{answer}"
    );
    assert!(
        progress.windows(2).all(|w| w[0] < w[1]),
        "none twice, none out of order: {progress:?}"
    );
    assert!(progress.len() > 1, "the missed progress came: {progress:?}");
    assert!(
        events.next().await.is_none(),
        "the stream ends with the answer"
    );
    agent.abort();
}

async fn lists_the_robots_tools_and_context(operator: &mut Client<'_>) {
    let listed = operator.ask("tools/list", json!({})).await;
    let tools = listed["result"]["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    for name in ["drive", "stop", "emergency_stop"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let resources = operator.ask("resources/list", json!({})).await;
    let uris = resources["result"]["resources"].to_string();
    assert!(uris.contains("arp://context/odometry"), "{uris}");
}

/// Eyes: capture_image is MCP image content, a JPEG.
async fn captures_a_jpeg(operator: &mut Client<'_>) {
    let shot = operator.call("capture_image", json!({})).await;
    assert_eq!(shot["content"][0]["type"], "image", "{shot}");
    assert_eq!(shot["content"][0]["mimeType"], "image/jpeg");
    let jpeg = {
        use base64::Engine as _;
        let data = shot["content"][0]["data"].as_str().expect("data");
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64")
    };
    assert_eq!(&jpeg[..2], &[0xFF, 0xD8]);
    assert_eq!(&jpeg[jpeg.len() - 2..], &[0xFF, 0xD9]);
}

/// `_meta.idempotencyKey`: the same key twice runs once, with the same result.
async fn a_keyed_retry_runs_once(operator: &mut Client<'_>, drive: &Value, after: f64) {
    let keyed =
        json!({ "name": "drive", "arguments": drive, "_meta": { "idempotencyKey": "k-1" } });
    let first = operator.ask("tools/call", keyed.clone()).await;
    let moved = operator.odometry_x().await;
    let again = operator.ask("tools/call", keyed).await;
    let still = operator.odometry_x().await;
    assert_eq!(first["result"], again["result"]);
    assert!(moved > after + 0.05, "{after} -> {moved}");
    assert!(
        (still - moved).abs() < 0.02,
        "the retry moved: {moved} -> {still}"
    );
}

/// DELETE ends the session: its id is unknown from then on.
async fn delete_ends_the_session(running: &Running, token: &str, operator: &mut Client<'_>) {
    let deleted = running
        .http
        .delete(url(running))
        .bearer_auth(token)
        .header("mcp-session-id", operator.session.clone().expect("session"))
        .send()
        .await
        .expect("HTTP");
    assert_eq!(deleted.status(), 204);
    let list = json!({ "jsonrpc": "2.0", "id": 99, "method": "tools/list" });
    assert_eq!(operator.post(list).await.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_with_its_grant_and_its_token() {
    let (running, tokens, agent) = robot_online().await;
    let list = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/list" });
    // The grant withdrawn: the gateway session ends, and with it the MCP session.
    let mut viewer = Client::new(&running, &tokens.viewer);
    viewer.initialize().await;
    running
        .admin(
            reqwest::Method::DELETE,
            &format!("/v1/robots/{ROBOT}/grants/mcp-viewer"),
            None,
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = viewer.post(list.clone()).await.status();
        if status == 404 {
            break;
        }
        assert_eq!(status, 200);
        assert!(Instant::now() < deadline, "the session outlived its grant");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The token revoked: refused (401) before the session is even looked up.
    let mut operator = Client::new(&running, &tokens.operator);
    operator.initialize().await;
    let listed = running
        .admin(reqwest::Method::GET, "/v1/tokens", None)
        .await;
    let token_id = listed
        .as_array()
        .and_then(|t| t.iter().find(|t| t["subject"] == "mcp-operator"))
        .and_then(|t| t["tokenId"].as_str())
        .unwrap_or_else(|| panic!("the operator's token: {listed}"))
        .to_string();
    running
        .admin(
            reqwest::Method::DELETE,
            &format!("/v1/tokens/{token_id}"),
            None,
        )
        .await;
    assert_eq!(operator.post(list).await.status(), 401);
    agent.abort();
}

/// The audit records of `tool` called by `subject`, once there are `count` (the log is
/// written in batches: polled, bounded).
async fn audited(running: &Running, tool: &str, subject: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let audit = running
            .admin(
                reqwest::Method::GET,
                &format!("/v1/robots/{ROBOT}/audit?limit=100"),
                None,
            )
            .await;
        let records: Vec<Value> = audit["records"]
            .as_array()
            .expect("records")
            .iter()
            .filter(|r| r["tool"] == tool && r["subject"] == subject && r["outcome"] != "pending")
            .cloned()
            .collect();
        if records.len() >= count {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "{count} {tool} records of {subject}: {audit}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tool-call round trips (`list_locations`), the remote endpoint against the ARP gateway,
/// same sitting: `cargo test --release -p agent-server-tests --test mcp_endpoint --
/// --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn tool_call_round_trips_endpoint_vs_gateway() {
    // Under the gateway's and the robot's call rates (one call per tick, waited for).
    let mut pace = tokio::time::interval(Duration::from_millis(40));
    let (running, tokens, agent) = robot_online().await;
    let mcp = round_trips_over_mcp(&running, &tokens.operator, &mut pace).await;
    let gateway = round_trips_over_the_gateway(&running, &tokens.operator, &mut pace).await;
    println!(
        "tools/call list_locations, remote MCP endpoint: {}",
        quantiles(mcp)
    );
    println!(
        "arp.callTool list_locations, ARP gateway:     {}",
        quantiles(gateway)
    );
    agent.abort();
}

const CALLS: usize = 300;
const WARM_UP: usize = 20;

fn quantiles(mut times: Vec<Duration>) -> String {
    times.sort();
    let p = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    format!("p50 {:?} p99 {:?} (n={})", p(0.5), p(0.99), times.len())
}

async fn round_trips_over_mcp(
    running: &Running,
    token: &str,
    pace: &mut tokio::time::Interval,
) -> Vec<Duration> {
    let mut operator = Client::new(running, token);
    operator.initialize().await;
    let mut times = Vec::new();
    for i in 0..CALLS + WARM_UP {
        pace.tick().await;
        let started = Instant::now();
        let result = operator.call("list_locations", json!({})).await;
        if i >= WARM_UP {
            times.push(started.elapsed());
        }
        assert_eq!(result["isError"], false, "{result}");
    }
    delete_ends_the_session(running, token, &mut operator).await;
    times
}

async fn round_trips_over_the_gateway(
    running: &Running,
    token: &str,
    pace: &mut tokio::time::Interval,
) -> Vec<Duration> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;
    let mut request = (running.base.replace("http://", "ws://")
        + &format!("/v1/robots/{ROBOT}/arp"))
        .into_client_request()
        .expect("request");
    let bearer = format!("Bearer {token}").parse().expect("header");
    request.headers_mut().insert("authorization", bearer);
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgraded");
    let mut times = Vec::new();
    for id in 0..CALLS + WARM_UP + 1 {
        let (method, params) = if id == 0 {
            (
                "arp.initialize",
                json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "bench", "version": "0" } }),
            )
        } else {
            (
                "arp.callTool",
                json!({ "name": "list_locations", "arguments": {} }),
            )
        };
        let frame = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        pace.tick().await;
        let started = Instant::now();
        ws.send(Message::text(frame.to_string()))
            .await
            .expect("send");
        let answer = loop {
            let Some(Ok(Message::Text(text))) = ws.next().await else {
                panic!("the gateway closed");
            };
            let answer: Value = serde_json::from_str(&text).expect("JSON");
            if answer["id"] == json!(id) && answer.get("method").is_none() {
                break answer;
            }
        };
        assert!(answer.get("result").is_some(), "{answer}");
        if id > WARM_UP {
            times.push(started.elapsed());
        }
    }
    times
}

/// `examples/mcp_remote_host.py --check`: the official MCP Python SDK over Streamable HTTP
/// (initialize, tools/list, resources, a drive that moves the sim, a viewer refused
/// motion, 401 and 403). Skipped, saying so, where python3 or its `mcp` package is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_sdk_drives_the_robot() {
    if !python::has_module("mcp.client.streamable_http", "pip install mcp").await {
        return;
    }
    let (running, tokens, agent) = robot_online().await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/mcp_remote_host.py"
    );
    let env = [
        ("MCP_TOKEN", tokens.operator.as_str()),
        ("MCP_VIEWER_TOKEN", tokens.viewer.as_str()),
        ("MCP_STRANGER_TOKEN", tokens.stranger.as_str()),
    ];
    let args = ["--check", "--url", &url(&running)];
    let stdout = python::run(script, &args, &env, Duration::from_secs(60)).await;
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    agent.abort();
}
