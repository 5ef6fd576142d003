//! The built `arp-bridge` binary, driven over its stdin/stdout, against
//! the real robot-agent ARP endpoint (in process, sim driver, 127.0.0.1:0).
//! Between the two sits a small WebSocket proxy that validates every ARP
//! frame either way against the project's ARP schema and can cut the
//! connection (the robot going away). No sleeps: every wait is for a
//! message, bounded by [`WAIT`].

use std::collections::{HashMap, VecDeque};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use robot_agent::arp::ws::ArpListener;
use robot_agent::arp::{ArpOptions, ArpServer, ListenConfig, Token};
use robot_agent::driver::sim::{self, SimConfig, SimProbe};
use robot_agent::driver::DriverHandle;
use robot_agent::locations::LocationStore;
use robot_agent::safety::SafetyLimits;
use robot_agent::session::{Metrics, Shared};
use robot_agent::settings::Settings;
use serde_json::{json, Value};
use signalling_protocol::arp_schema::ArpValidator;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpListener;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[path = "support/python.rs"]
mod python;

const OPERATOR: &str = "bridge-operator-secret";
const VIEWER: &str = "bridge-viewer-secret";
/// Longest wait for any one thing.
const WAIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------
// The robot: robot-agent's ARP server on its own WebSocket listener.

struct Robot {
    /// The real `--arp-listen` endpoint.
    direct_url: String,
    /// The validating proxy in front of it.
    url: String,
    probe: SimProbe,
    proxy: Proxy,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Robot {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.proxy.cut();
    }
}

async fn robot(confirm: &[&str]) -> Robot {
    let (handle, end) = DriverHandle::channel();
    let pose = handle.pose.clone();
    let probe = sim::spawn(end, SimConfig::default());
    let limits = SafetyLimits::default();
    let controller = robot_agent::controller::spawn(limits.clone(), handle);
    let ready = async {
        while !controller.status().await.expect("status").driver_ready {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(WAIT, ready)
        .await
        .expect("sim driver ready");
    let shared = Shared {
        controller,
        locations: Arc::new(Mutex::new(LocationStore::in_memory(10))),
        settings: Arc::new(Mutex::new(Settings::defaults(&limits))),
        base_limits: limits,
        metrics: Arc::new(Metrics::default()),
        reply_signer: None,
    };
    let mut options = ArpOptions::default();
    for tool in confirm {
        options.confirm.insert((*tool).to_owned(), true);
    }
    let server = ArpServer::new(shared, pose, options);
    let tokens: Vec<Token> = [format!("operator:{OPERATOR}"), format!("viewer:{VIEWER}")]
        .iter()
        .map(|t| t.parse().expect("token"))
        .collect();
    let listener = ArpListener::bind(&ListenConfig::new("127.0.0.1:0", tokens).expect("listen"))
        .await
        .expect("bind");
    let direct_url = format!("ws://{}/", listener.local_addr().expect("addr"));
    let serve = tokio::spawn(listener.run(server));
    let proxy = Proxy::start(direct_url.clone()).await;
    Robot {
        url: proxy.url.clone(),
        direct_url,
        probe,
        proxy,
        tasks: vec![serve],
    }
}

// ---------------------------------------------------------------------
// The validating proxy.

#[derive(Default)]
struct Seen {
    /// Frames validated against the schema, both ways.
    frames: usize,
    /// Schema failures (should stay empty).
    invalid: Vec<String>,
    /// Every frame the bridge sent to the robot, parsed.
    from_bridge: Vec<Value>,
    /// Every frame the robot sent to the bridge, parsed.
    from_robot: Vec<Value>,
}

#[derive(Clone)]
struct Proxy {
    url: String,
    seen: Arc<Mutex<Seen>>,
    changed: Arc<Notify>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: Arc<Mutex<Option<tokio::task::AbortHandle>>>,
}

fn key(id: &Value) -> String {
    id.to_string()
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let proxy = Proxy {
            url: format!("ws://{}/", listener.local_addr().expect("addr")),
            seen: Arc::default(),
            changed: Arc::default(),
            conns: Arc::default(),
            accept: Arc::default(),
        };
        let p = proxy.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let task = tokio::spawn(p.clone().serve(stream, upstream.clone()));
                p.conns.lock().unwrap().push(task.abort_handle());
            }
        });
        *proxy.accept.lock().unwrap() = Some(accept.abort_handle());
        proxy
    }

    // The handshake callback's error type is tungstenite's (an HTTP response).
    #[allow(clippy::result_large_err)]
    async fn serve(self, stream: tokio::net::TcpStream, upstream: String) {
        let mut auth = None;
        let callback = |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
            auth = req.headers().get("authorization").cloned();
            Ok(resp)
        };
        let Ok(down) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
            return;
        };
        let mut request = upstream.into_client_request().expect("upstream url");
        if let Some(auth) = auth {
            request.headers_mut().insert("authorization", auth);
        }
        let Ok((up, _)) = tokio_tungstenite::connect_async(request).await else {
            return;
        };
        let (mut down_tx, mut down_rx) = down.split();
        let (mut up_tx, mut up_rx) = up.split();
        // Methods of requests in flight, per direction, to validate results.
        let to_robot: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let to_bridge: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let (seen, changed) = (self.seen.clone(), self.changed.clone());
        let (tr, tb) = (to_robot.clone(), to_bridge.clone());
        let upward = async move {
            while let Some(Ok(m)) = down_rx.next().await {
                if let Message::Text(t) = &m {
                    record(&seen, &changed, t, &tr, &tb, true);
                }
                if matches!(m, Message::Close(_)) || up_tx.send(m).await.is_err() {
                    break;
                }
            }
            let _ = up_tx.close().await;
        };
        let (seen, changed) = (self.seen.clone(), self.changed.clone());
        let downward = async move {
            while let Some(Ok(m)) = up_rx.next().await {
                if let Message::Text(t) = &m {
                    record(&seen, &changed, t, &to_bridge, &to_robot, false);
                }
                if down_tx.send(m).await.is_err() {
                    break;
                }
            }
            let _ = down_tx.close().await;
        };
        tokio::join!(upward, downward);
    }

    /// Cuts every connection at once, without a close frame: the robot
    /// vanishes as if its host went away.
    fn cut(&self) {
        if let Some(a) = self.accept.lock().unwrap().take() {
            a.abort();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap())
    }

    /// Waits until the proxy has seen what `ready` looks for.
    async fn wait_for(&self, what: &str, ready: impl Fn(&Seen) -> bool) {
        let wait = async {
            loop {
                let notified = self.changed.notified();
                if self.seen(&ready) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(WAIT, wait)
            .await
            .unwrap_or_else(|_| panic!("the proxy never saw {what}"));
    }

    fn assert_valid(&self) {
        self.seen(|s| {
            assert!(s.invalid.is_empty(), "invalid ARP frames: {:#?}", s.invalid);
            assert!(s.frames > 0, "no frame validated");
        });
    }
}

/// Validates one frame; `outbound`: from the bridge to the robot. `mine`
/// holds the methods of requests this side sent, `theirs` the other's.
fn record(
    seen: &Mutex<Seen>,
    changed: &Notify,
    text: &str,
    mine: &Mutex<HashMap<String, String>>,
    theirs: &Mutex<HashMap<String, String>>,
    outbound: bool,
) {
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            seen.lock()
                .unwrap()
                .invalid
                .push(format!("not JSON: {e}: {text}"));
            return;
        }
    };
    let answered = match (value.get("method"), value.get("id")) {
        (Some(Value::String(m)), Some(id)) => {
            mine.lock().unwrap().insert(key(id), m.clone());
            None
        }
        (None, Some(id)) => theirs.lock().unwrap().remove(&key(id)),
        _ => None,
    };
    let check = ArpValidator::shared().validate(&value, answered.as_deref());
    let mut s = seen.lock().unwrap();
    s.frames += 1;
    if let Err(e) = check {
        let way = if outbound {
            "bridge → robot"
        } else {
            "robot → bridge"
        };
        s.invalid.push(format!("{way}: {e}\n{value}"));
    }
    if outbound {
        s.from_bridge.push(value);
    } else {
        s.from_robot.push(value);
    }
    drop(s);
    changed.notify_waiters();
}

// ---------------------------------------------------------------------
// The bridge process and a scripted client on its stdin/stdout.

struct Bridge {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    backlog: VecDeque<Value>,
}

impl Bridge {
    fn spawn(args: &[&str], token_env: Option<&str>) -> Bridge {
        let mut command = Command::new(env!("CARGO_BIN_EXE_arp-bridge"));
        command
            .args(args)
            .env_remove("ARP_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(token) = token_env {
            command.env("ARP_TOKEN", token);
        }
        let mut child = command.spawn().expect("spawn arp-bridge");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        Bridge {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            backlog: VecDeque::new(),
        }
    }

    async fn send_raw(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(text.as_bytes()).await.expect("write");
        stdin.write_all(b"\n").await.expect("write");
        stdin.flush().await.expect("flush");
    }

    async fn send(&mut self, message: Value) {
        self.send_raw(&message.to_string()).await;
    }

    /// The next line from stdout, which must be one JSON object.
    async fn read(&mut self) -> Value {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("a line from the bridge in time")
            .expect("read stdout")
            .expect("the bridge's stdout ended");
        let value: Value = serde_json::from_str(&line).expect("each line is JSON");
        assert!(value.is_object(), "one object per line: {line}");
        value
    }

    /// The next message that `pick` accepts; others are kept for later.
    async fn find(&mut self, pick: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&pick) {
            return self.backlog.remove(i).expect("present");
        }
        loop {
            let v = self.read().await;
            if pick(&v) {
                return v;
            }
            self.backlog.push_back(v);
        }
    }

    async fn response(&mut self, id: Value) -> Value {
        self.find(|v| v.get("method").is_none() && v["id"] == id)
            .await
    }

    async fn notification(&mut self, method: &str) -> Value {
        self.find(|v| v["method"] == method && v.get("id").is_none())
            .await
    }

    async fn call(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        self.response(id).await
    }

    async fn result(&mut self, id: Value, method: &str, params: Value) -> Value {
        let v = self.call(id, method, params).await;
        assert!(v.get("result").is_some(), "{method} failed: {v}");
        v["result"].clone()
    }

    /// Closes stdin and waits for the process to end.
    async fn eof(&mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.wait().await
    }

    async fn wait(&mut self) -> ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the bridge exits in time")
            .expect("wait")
    }
}

// ---------------------------------------------------------------------
// arp mode.

async fn context_updates_come_up(b: &mut Bridge) {
    b.result(
        json!(6),
        "arp.subscribeContext",
        json!({ "name": "odometry" }),
    )
    .await;
    let update = b.notification("arp.contextUpdate").await;
    assert_eq!(update["params"]["name"], "odometry");
    b.result(
        json!(7),
        "arp.unsubscribeContext",
        json!({ "name": "odometry" }),
    )
    .await;
}

/// A broken line, a batch and an oversized line: answered by the bridge
/// itself with id null.
async fn framing_errors_are_the_bridges(b: &mut Bridge) {
    b.send_raw("{\"jsonrpc\":\"2.0\",\"id\":1,").await;
    let e = b.response(Value::Null).await;
    assert_eq!(e["error"]["code"], -32700, "{e}");
    b.send_raw(r#"[{"jsonrpc":"2.0","id":2,"method":"arp.listTools"}]"#)
        .await;
    let e = b.response(Value::Null).await;
    assert_eq!(e["error"]["code"], -32600, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("batch"));
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"arp.listTools","params":{{"pad":"{}"}}}}"#,
        "x".repeat(70 * 1024)
    );
    b.send_raw(&huge).await;
    let e = b.response(Value::Null).await;
    assert_eq!(e["error"]["code"], -32600, "{e}");
    assert_eq!(e["error"]["data"]["limit"], 65536);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arp_mode_relays_a_session_both_ways() {
    let robot = robot(&["save_location"]).await;
    let mut b = Bridge::spawn(&["--url", &robot.url, "--token", OPERATOR], None);

    // Ready comes first, before anything is asked.
    let ready = b.read().await;
    assert_eq!(ready["method"], "arp-bridge.ready", "{ready}");
    assert_eq!(ready["params"]["ok"], true);
    assert_eq!(ready["params"]["mode"], "arp");

    let d = b.result(json!(0), "arp-bridge.describe", json!({})).await;
    assert!(d["methods"]
        .as_array()
        .unwrap()
        .contains(&json!("arp.callTool")));

    // Framing errors are the bridge's own, answered with id null.
    framing_errors_are_the_bridges(&mut b).await;

    let init = b
        .result(
            json!(4),
            "arp.initialize",
            // This parent answers confirmations (below), so it says so: robot-agent asks
            // only a client that declared it.
            json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "test", "version": "1" },
                "capabilities": { "confirmation": true } }),
        )
        .await;
    assert_eq!(init["protocolVersion"], "0.1.0");
    let tools = b.result(json!("t"), "arp.listTools", json!({})).await;
    assert!(tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "drive"));

    // A drive: progress notifications come up before the answer.
    let drive = json!({ "name": "drive", "arguments": { "linear": 0.2, "angular": 0.0, "durationSecs": 0.5 } });
    b.send(json!({ "jsonrpc": "2.0", "id": 5, "method": "arp.callTool", "params": drive }))
        .await;
    let done = b.response(json!(5)).await;
    assert_eq!(done["result"]["state"], "completed", "{done}");
    let call_id = done["result"]["callId"].clone();
    let progress: Vec<&Value> = b
        .backlog
        .iter()
        .filter(|v| v["method"] == "arp.toolProgress" && v["params"]["callId"] == call_id)
        .collect();
    assert!(progress.len() >= 2, "progress: {progress:?}");
    assert!(robot.probe.state().x > 0.0, "the sim moved");

    // Context updates come up.
    context_updates_come_up(&mut b).await;

    // A robot → client request goes up, and its answer goes down.
    b.send(json!({ "jsonrpc": "2.0", "id": 8, "method": "arp.callTool",
        "params": { "name": "save_location", "arguments": { "name": "dock" } } }))
        .await;
    let ask = b.notification_or_request("arp.requestConfirmation").await;
    assert_eq!(ask["params"]["details"]["tool"], "save_location");
    b.send(json!({ "jsonrpc": "2.0", "id": ask["id"], "result": {
        "confirmed": true, "confirmedBy": "tester", "timestamp": "2026-01-01T00:00:00Z" } }))
        .await;
    let saved = b.response(json!(8)).await;
    assert_eq!(saved["result"]["state"], "completed", "{saved}");

    // End of stdin: a clean close, exit 0.
    let status = b.eof().await;
    assert_eq!(status.code(), Some(0));
    robot.proxy.assert_valid();
}

impl Bridge {
    /// A request from the robot (it has an id and a method).
    async fn notification_or_request(&mut self, method: &str) -> Value {
        self.find(|v| v["method"] == method).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_token_is_refused_before_ready() {
    let robot = robot(&[]).await;
    let mut b = Bridge::spawn(&["--url", &robot.direct_url], Some("wrong-secret"));
    let ready = b.read().await;
    assert_eq!(ready["method"], "arp-bridge.ready");
    assert_eq!(ready["params"]["ok"], false, "{ready}");
    assert_eq!(ready["params"]["error"]["kind"], "unauthorized");
    assert!(
        !ready.to_string().contains("wrong-secret"),
        "the token leaked"
    );
    assert_eq!(b.wait().await.code(), Some(1));
}

// ---------------------------------------------------------------------
// mcp mode.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_host_learns_why_the_bridge_could_not_start() {
    let robot = robot(&[]).await;
    let mut b = Bridge::spawn(
        &["--mode", "mcp", "--url", &robot.direct_url],
        Some("wrong-secret"),
    );
    let ready = b.read().await;
    assert_eq!(ready["params"]["ok"], false, "{ready}");
    // The host's first request is answered with the cause, not a closed pipe.
    b.send(
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": { "name": "test", "version": "1" } } }),
    )
    .await;
    let answer = b.response(json!(1)).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(
        answer["error"]["data"]["reason"], "unauthorized",
        "{answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unauthorized")),
        "{answer}"
    );
    assert_eq!(b.wait().await.code(), Some(1));
}

async fn mcp_bridge(url: &str, args: &[&str], token: &str) -> Bridge {
    let mut all = vec!["--mode", "mcp", "--url", url];
    all.extend_from_slice(args);
    let mut b = Bridge::spawn(&all, Some(token));
    // The bridge initializes ARP once the host's initialize says what it can do, and says
    // ready before it answers.
    b.send(
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": { "name": "test", "version": "1" } } }),
    )
    .await;
    let ready = b.read().await;
    assert_eq!(ready["method"], "arp-bridge.ready", "{ready}");
    assert_eq!(ready["params"]["ok"], true, "{ready}");
    assert_eq!(ready["params"]["robot"]["name"], "robot-agent");
    let init = b.response(json!(1)).await["result"].clone();
    assert_eq!(init["protocolVersion"], "2025-06-18");
    assert!(init["capabilities"]["tools"].is_object());
    assert!(init["capabilities"]["resources"].is_object());
    assert_eq!(init["serverInfo"]["name"], "arp-bridge");
    b.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
        .await;
    b
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// Tools: the robot's, with their schemas, and emergency_stop; a short
/// drive with a progress token.
async fn tools_and_a_drive(b: &mut Bridge) {
    let listed = b.result(json!(2), "tools/list", json!({})).await;
    let tools = listed["tools"].as_array().unwrap();
    let drive = tools.iter().find(|t| t["name"] == "drive").expect("drive");
    assert!(drive["inputSchema"]["properties"]["durationSecs"].is_object());
    assert_eq!(drive["inputSchema"]["type"], "object");
    assert_eq!(drive["annotations"]["readOnlyHint"], false);
    assert_eq!(drive["annotations"]["destructiveHint"], true);
    // The robot's velocity limit, in the schema.
    let linear = &drive["inputSchema"]["properties"]["linear"];
    assert!(
        linear["maximum"].as_f64().is_some_and(|m| m > 0.0),
        "{linear}"
    );
    let list = tools
        .iter()
        .find(|t| t["name"] == "list_locations")
        .expect("list_locations");
    assert_eq!(list["annotations"]["readOnlyHint"], true);
    assert!(tools.iter().any(|t| t["name"] == "emergency_stop"));

    b.send(
        json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "drive", "arguments": { "linear": 0.2, "angular": 0.0, "durationSecs": 0.5 },
        "_meta": { "progressToken": "drive-1" } } }),
    )
    .await;
    let done = b.response(json!(3)).await;
    let result = &done["result"];
    assert_eq!(result["isError"], false, "{done}");
    assert_eq!(result["structuredContent"]["state"], "completed");
    assert!(text_of(result).contains("completed"));
    let progress: Vec<f64> = b
        .backlog
        .iter()
        .filter(|v| v["method"] == "notifications/progress")
        .map(|v| {
            assert_eq!(v["params"]["progressToken"], "drive-1");
            v["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    assert!(progress.len() >= 2, "progress {progress:?}");
    assert!(
        progress.windows(2).all(|w| w[0] < w[1]),
        "increasing: {progress:?}"
    );
    b.backlog.clear();
}

/// Refusals: a tool needing a person (fail closed), an unknown tool, a bad
/// argument.
async fn calls_the_robot_refuses(b: &mut Bridge) {
    // The tool needs a person and the bridge declared it answers no confirmation: the
    // robot denies the call at once (fail closed), without asking.
    let saved = b
        .result(
            json!(4),
            "tools/call",
            json!({ "name": "save_location", "arguments": { "name": "dock" } }),
        )
        .await;
    assert_eq!(saved["isError"], true, "{saved}");
    assert_eq!(saved["structuredContent"]["error"]["code"], -40006);
    assert!(text_of(&saved).contains("-40006"));

    // An unknown tool is a protocol error; a bad argument a tool error.
    let unknown = b
        .call(
            json!(5),
            "tools/call",
            json!({ "name": "fly", "arguments": {} }),
        )
        .await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    let bad = b
        .result(
            json!(6),
            "tools/call",
            json!({ "name": "drive", "arguments": { "linear": 1 } }),
        )
        .await;
    assert_eq!(bad["isError"], true);
    assert_eq!(bad["structuredContent"]["error"]["code"], -32602);
}

/// Resources: the context sources, read once each.
async fn resources_are_the_context_sources(b: &mut Bridge, robot: &Robot) {
    let listed = b.result(json!(7), "resources/list", json!({})).await;
    let uris: Vec<&str> = listed["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert!(uris.contains(&"arp://context/odometry"), "{uris:?}");
    assert!(uris.contains(&"arp://context/status"), "{uris:?}");
    let read = b
        .result(
            json!(8),
            "resources/read",
            json!({ "uri": "arp://context/odometry" }),
        )
        .await;
    let content = &read["contents"][0];
    assert_eq!(content["uri"], "arp://context/odometry");
    let update: Value = serde_json::from_str(content["text"].as_str().unwrap()).unwrap();
    assert!(
        update["data"]["position"]["x"].as_f64().unwrap() > 0.0,
        "{update}"
    );
    robot
        .proxy
        .wait_for("the unsubscribe after the read", |s| {
            s.from_bridge
                .iter()
                .any(|v| v["method"] == "arp.unsubscribeContext")
        })
        .await;
    let missing = b
        .call(
            json!(9),
            "resources/read",
            json!({ "uri": "arp://context/lidar" }),
        )
        .await;
    assert_eq!(missing["error"]["code"], -32002, "{missing}");
}

/// Cancelling a running call sends arp.cancelTool; no answer follows.
async fn cancelling_a_call(b: &mut Bridge, robot: &Robot) {
    b.send(
        json!({ "jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {
        "name": "drive", "arguments": { "linear": 0.1, "angular": 0.0, "durationSecs": 10 },
        "_meta": { "progressToken": 10 } } }),
    )
    .await;
    b.find(|v| v["method"] == "notifications/progress" && v["params"]["progressToken"] == 10)
        .await;
    b.send(
        json!({ "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": { "requestId": 10, "reason": "changed my mind" } }),
    )
    .await;
    robot
        .proxy
        .wait_for("the cancelled call's end", |s| {
            s.from_robot
                .iter()
                .any(|v| v["result"]["state"] == "cancelled")
        })
        .await;
    assert!(robot.proxy.seen(|s| s
        .from_bridge
        .iter()
        .any(|v| v["method"] == "arp.cancelTool")));
    // A round trip through the robot after the end: still no answer to 10.
    b.result(json!(11), "tools/call", json!({ "name": "list_locations" }))
        .await;
    assert!(
        !b.backlog.iter().any(|v| v["id"] == 10),
        "a cancelled request was answered: {:?}",
        b.backlog
    );
}

/// emergency_stop → arp.emergencyStop; motion is refused afterwards.
async fn the_emergency_stop_tool(b: &mut Bridge, robot: &Robot) {
    let stopped = b
        .result(
            json!(12),
            "tools/call",
            json!({ "name": "emergency_stop", "arguments": { "reason": "test" } }),
        )
        .await;
    assert_eq!(stopped["isError"], false, "{stopped}");
    assert_eq!(stopped["structuredContent"]["stopped"], true);
    assert_eq!(
        robot.probe.state().last_stop.as_deref(),
        Some("emergency_stop")
    );
    let refused = b
        .result(
            json!(13),
            "tools/call",
            json!({ "name": "drive",
            "arguments": { "linear": 0.1, "angular": 0.0, "durationSecs": 0.5 } }),
        )
        .await;
    assert_eq!(refused["isError"], true);
    assert_eq!(
        refused["structuredContent"]["error"]["code"], -40007,
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_mode_serves_tools_resources_and_the_emergency_stop() {
    let robot = robot(&["save_location"]).await;
    let mut b = mcp_bridge(&robot.url, &[], OPERATOR).await;
    assert_eq!(b.result(json!("p"), "ping", json!({})).await, json!({}));

    tools_and_a_drive(&mut b).await;
    calls_the_robot_refuses(&mut b).await;
    resources_are_the_context_sources(&mut b, &robot).await;
    cancelling_a_call(&mut b, &robot).await;
    the_emergency_stop_tool(&mut b, &robot).await;

    let status = b.eof().await;
    assert_eq!(status.code(), Some(0));
    robot
        .proxy
        .wait_for("arp.shutdown", |s| {
            s.from_bridge.iter().any(|v| v["method"] == "arp.shutdown")
        })
        .await;
    robot.proxy.assert_valid();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_mode_reports_a_forbidden_call_as_a_tool_error() {
    let robot = robot(&[]).await;
    let dir = std::env::temp_dir().join(format!("arp-bridge-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("viewer.token");
    std::fs::write(&token_file, format!("{VIEWER}\n")).unwrap();
    // The file wins; ARP_TOKEN (the operator's) is not used.
    let path = token_file.to_str().unwrap();
    let mut b = mcp_bridge(&robot.url, &["--token-file", path], OPERATOR).await;
    let refused = b
        .result(
            json!(2),
            "tools/call",
            json!({ "name": "drive",
            "arguments": { "linear": 0.1, "angular": 0.0, "durationSecs": 0.5 } }),
        )
        .await;
    assert_eq!(refused["isError"], true, "{refused}");
    let error = &refused["structuredContent"]["error"];
    assert_eq!(error["code"], -40001);
    assert_eq!(error["data"]["reason"], "forbidden");
    assert!(text_of(&refused).contains("forbidden"));
    assert_eq!(b.eof().await.code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(robot.probe.state().x, 0.0, "a viewer moved nothing");
    robot.proxy.assert_valid();
}

/// The official MCP Python SDK as the host, arp-bridge its stdio server
/// (`examples/mcp_stdio_host.py --check`): capture_image is a JPEG that decodes, and a call
/// the robot wants confirmed is put to the host's user through elicitation (declined: the
/// call fails -40006; accepted: it runs). Skipped, saying so, without python3 and `mcp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_sdk_over_stdio_confirms_and_sees() {
    if !python::has_module("mcp.client.stdio", "pip install mcp").await {
        return;
    }
    let robot = robot(&["save_location"]).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/mcp_stdio_host.py"
    );
    let args = [
        "--check",
        "--bridge",
        env!("CARGO_BIN_EXE_arp-bridge"),
        "--url",
        &robot.url,
    ];
    let env = [("ARP_TOKEN", OPERATOR)];
    let stdout = python::run(script, &args, &env, Duration::from_secs(60)).await;
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    // The bridge declared confirmation (its host can elicit) and answered the robot's
    // requests: once no, once yes.
    let answers: Vec<bool> = robot.proxy.seen(|s| {
        s.from_bridge
            .iter()
            .filter_map(|v| v["result"]["confirmed"].as_bool())
            .collect()
    });
    assert_eq!(answers, [false, true]);
    robot.proxy.assert_valid();
}

// ---------------------------------------------------------------------
// The robot going away.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arp_mode_fails_pending_requests_when_the_robot_goes_away() {
    let robot = robot(&[]).await;
    let mut b = Bridge::spawn(&["--url", &robot.url], Some(OPERATOR));
    assert_eq!(b.read().await["params"]["ok"], true);
    b.result(
        json!(1),
        "arp.initialize",
        json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "test", "version": "1" } }),
    )
    .await;
    b.send(
        json!({ "jsonrpc": "2.0", "id": "long", "method": "arp.callTool", "params": {
        "name": "drive", "arguments": { "linear": 0.1, "angular": 0.0, "durationSecs": 10 } } }),
    )
    .await;
    b.notification("arp.toolProgress").await;
    robot.proxy.cut();
    let failed = b.response(json!("long")).await;
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    assert_eq!(failed["error"]["data"]["reason"], "robot_offline");
    let closed = b.notification("arp-bridge.closed").await;
    assert_eq!(closed["params"]["unanswered"], 1);
    assert_eq!(b.wait().await.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_mode_fails_pending_requests_when_the_robot_goes_away() {
    let robot = robot(&[]).await;
    let mut b = mcp_bridge(&robot.url, &[], OPERATOR).await;
    b.send(
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "drive", "arguments": { "linear": 0.1, "angular": 0.0, "durationSecs": 10 },
        "_meta": { "progressToken": "p" } } }),
    )
    .await;
    b.notification("notifications/progress").await;
    robot.proxy.cut();
    let failed = b.response(json!(2)).await;
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    assert_eq!(failed["error"]["data"]["reason"], "robot_offline");
    b.notification("arp-bridge.closed").await;
    assert_eq!(b.wait().await.code(), Some(2));
}

// ---------------------------------------------------------------------
// wss:// with a private CA (--ca-file).

/// A TLS front on 127.0.0.1:0 for the robot's plain socket, with a
/// certificate from a fresh CA; returns its port and the CA's PEM.
async fn tls_front(upstream: String) -> (u16, String, tokio::task::JoinHandle<()>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "arp-bridge test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_pem = ca_params.self_signed(&ca_key).expect("CA").pem();
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = KeyPair::generate().expect("key");
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&leaf_key, &issuer)
        .expect("leaf");
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key.into())
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (port, ca_pem, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_with_a_private_ca_needs_the_ca_file() {
    let robot = robot(&[]).await;
    let upstream = robot
        .direct_url
        .trim_start_matches("ws://")
        .trim_end_matches('/')
        .to_owned();
    let (port, ca_pem, front) = tls_front(upstream).await;
    let dir = std::env::temp_dir().join(format!("arp-bridge-ca-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let url = format!("wss://127.0.0.1:{port}/");

    // The system's roots do not know the private CA.
    let mut b = Bridge::spawn(&["--url", &url], Some(OPERATOR));
    let ready = b.read().await;
    assert_eq!(ready["params"]["ok"], false, "{ready}");
    assert_eq!(ready["params"]["error"]["kind"], "connect");
    assert_eq!(b.wait().await.code(), Some(1));

    let mut b = Bridge::spawn(
        &["--url", &url, "--ca-file", ca_file.to_str().unwrap()],
        Some(OPERATOR),
    );
    let ready = b.read().await;
    assert_eq!(ready["params"]["ok"], true, "{ready}");
    let init = b
        .result(
            json!(1),
            "arp.initialize",
            json!({ "protocolVersion": "0.1.0", "clientInfo": { "name": "test", "version": "1" } }),
        )
        .await;
    assert_eq!(init["serverInfo"]["name"], "robot-agent");
    assert_eq!(b.eof().await.code(), Some(0));
    front.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
