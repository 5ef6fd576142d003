//! ARP 0.1.0 conformance runner: drives any ARP endpoint by URL (the
//! robot agent's `--arp-listen` socket, or the cloud gateway at
//! `/v1/robots/{id}/arp`) and validates every frame either way against the
//! JSON Schema in `crates/protocol/schemas/arp/`.
//!
//! Used by the `arp_conformance` test (against an in-process agent with
//! the sim driver), the `arp_gateway_conformance` test (through the real
//! server's gateway) and the `arp-conformance` example (any URL).
//! Motion and e-stop checks are opt-in: they move and stop the robot.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use signalling_protocol::arp_schema::ArpValidator;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Longest wait for any one answer.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub url: String,
    /// An operator's (or owner's) token; `None`: connect without one.
    pub operator_token: Option<String>,
    /// A viewer's token, for the role checks.
    pub viewer_token: Option<String>,
    /// Run tools that move the robot (drive, cancel).
    pub motion: bool,
    /// Trigger and reset an emergency stop.
    pub estop: bool,
}

/// One named check and what became of it.
#[derive(Debug)]
pub struct Check {
    pub name: String,
    pub outcome: Result<(), String>,
}

#[derive(Debug, Default)]
pub struct Report {
    pub checks: Vec<Check>,
    /// Frames validated against the schema (both ways).
    pub frames: usize,
}

impl Report {
    fn record(&mut self, name: &str, outcome: Result<(), String>) {
        self.checks.push(Check {
            name: name.to_owned(),
            outcome,
        });
    }

    /// Prints every check, and fails (a test) unless all of them, at least
    /// 14, passed.
    pub fn assert_passed(&self) {
        for check in &self.checks {
            println!(
                "{:5} {}",
                if check.outcome.is_ok() { "ok" } else { "FAIL" },
                check.name
            );
        }
        let failures = self.failures();
        assert!(failures.is_empty(), "failed checks: {failures:#?}");
        assert!(self.checks.len() >= 14, "{} checks", self.checks.len());
    }

    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| c.outcome.is_err()).collect()
    }
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

struct Client {
    ws: Ws,
    next: u64,
    methods: HashMap<String, String>,
    backlog: VecDeque<Value>,
    frames: usize,
}

fn key(id: &Value) -> String {
    id.as_str().map_or_else(|| id.to_string(), str::to_owned)
}

macro_rules! ensure {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Err(format!($($why)+));
        }
    };
}

async fn connect(url: &str, token: Option<&str>) -> Result<Client, String> {
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(token) = token {
        let header = format!("Bearer {token}")
            .parse()
            .map_err(|_| "bad token".to_owned())?;
        request.headers_mut().insert("authorization", header);
    }
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| format!("connect: {e}"))?;
    Ok(Client {
        ws,
        next: 1,
        methods: HashMap::new(),
        backlog: VecDeque::new(),
        frames: 0,
    })
}

impl Client {
    async fn raw(&mut self, text: &str) -> Result<(), String> {
        self.ws
            .send(Message::text(text))
            .await
            .map_err(|e| e.to_string())
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = json!(format!("c{}", self.next));
        self.next += 1;
        self.methods.insert(key(&id), method.to_owned());
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        ArpValidator::shared()
            .validate(&message, None)
            .map_err(|e| format!("the runner built an invalid request: {e}"))?;
        self.frames += 1;
        self.raw(&message.to_string()).await?;
        Ok(id)
    }

    async fn read(&mut self) -> Result<Value, String> {
        loop {
            let frame = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .map_err(|_| "no frame in time".to_owned())?
                .ok_or("socket closed")?
                .map_err(|e| e.to_string())?;
            let text = match frame {
                Message::Text(t) => t.to_string(),
                Message::Close(c) => return Err(format!("closed: {c:?}")),
                _ => continue,
            };
            let value: Value = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
            let answered = value
                .get("id")
                .filter(|_| value.get("method").is_none())
                .and_then(|id| self.methods.get(&key(id)).cloned());
            ArpValidator::shared()
                .validate(&value, answered.as_deref())
                .map_err(|e| format!("invalid frame from the server: {e}\n{value}"))?;
            self.frames += 1;
            return Ok(value);
        }
    }

    async fn response(&mut self, id: &Value) -> Result<Value, String> {
        if let Some(i) = self
            .backlog
            .iter()
            .position(|v| v.get("method").is_none() && &v["id"] == id)
        {
            return self.backlog.remove(i).ok_or_else(|| "gone".into());
        }
        loop {
            let v = self.read().await?;
            if v.get("method").is_none() && &v["id"] == id {
                return Ok(v);
            }
            self.backlog.push_back(v);
        }
    }

    async fn message(&mut self, method: &str) -> Result<Value, String> {
        if let Some(i) = self.backlog.iter().position(|v| v["method"] == method) {
            return self.backlog.remove(i).ok_or_else(|| "gone".into());
        }
        loop {
            let v = self.read().await?;
            if v["method"] == method {
                return Ok(v);
            }
            self.backlog.push_back(v);
        }
    }

    /// Forgets progress of calls that have ended (it arrived before their
    /// responses), so the next progress read belongs to the next call.
    fn forget_progress(&mut self) {
        self.backlog.retain(|v| v["method"] != "arp.toolProgress");
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.request(method, params).await?;
        self.response(&id).await
    }

    async fn result(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let v = self.call(method, params).await?;
        match v.get("result") {
            Some(r) => Ok(r.clone()),
            None => Err(format!("{method} failed: {}", v["error"])),
        }
    }

    async fn error(&mut self, method: &str, params: Value, code: i64) -> Result<Value, String> {
        let v = self.call(method, params).await?;
        ensure!(
            v["error"]["code"] == code,
            "{method}: expected error {code}, got {v}"
        );
        Ok(v)
    }

    /// Sends raw text and expects an error with `code` (id null or echoed).
    async fn raw_error(&mut self, text: &str, code: i64) -> Result<(), String> {
        self.frames += 1;
        self.raw(text).await?;
        let v = self.read().await?;
        ensure!(
            v["error"]["code"] == code,
            "{text}: expected {code}, got {v}"
        );
        Ok(())
    }

    async fn initialize(&mut self) -> Result<Value, String> {
        self.result(
            "arp.initialize",
            json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "arp-conformance", "version": "1"}, "capabilities": {"confirmation": true, "planning": false}}),
        )
        .await
    }
}

const TOOLS: [&str; 7] = [
    "drive",
    "stop",
    "navigate_to",
    "cancel_navigation",
    "save_location",
    "list_locations",
    "reset_emergency_stop",
];

/// Runs every check; never panics.
pub async fn run(options: &Options) -> Report {
    let mut report = Report::default();
    if options.operator_token.is_some() {
        let refused = match tokio_tungstenite::connect_async(options.url.as_str()).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 401 => Ok(()),
            Err(e) => Err(format!("expected HTTP 401, got {e}")),
            Ok(_) => Err("a connection without a token was upgraded".into()),
        };
        report.record("no token: 401 before the upgrade", refused);
    }
    let mut op = match connect(&options.url, options.operator_token.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            report.record("connect", Err(e));
            return report;
        }
    };
    report.record("connect", Ok(()));
    let before = op.error("arp.listTools", json!({}), -40009).await.map(drop);
    report.record("-40009 before arp.initialize", before);
    let init = op.initialize().await.and_then(|r| {
        ensure!(
            r["protocolVersion"] == "0.1.0",
            "protocolVersion {}",
            r["protocolVersion"]
        );
        Ok(())
    });
    let initialized = init.is_ok();
    report.record("arp.initialize", init);
    if !initialized {
        return report;
    }
    let velocity = listings(&mut op, &mut report).await;
    if let Some(token) = &options.viewer_token {
        let viewer = viewer_may_not_move(&options.url, token).await;
        if let Ok(frames) = &viewer {
            report.frames += frames;
        }
        report.record("viewer: may not move (-40001 forbidden)", viewer.map(drop));
    }
    if options.motion {
        report.record("drive: progress then completed", drive(&mut op).await);
        let limit = velocity_limit(&mut op, velocity.as_ref()).await;
        report.record("velocity_limit enforced (reject or clamp)", limit);
        report.record("cancelTool: the call ends cancelled", cancel(&mut op).await);
    }
    if options.estop {
        let estop = emergency_stop(&mut op, options).await;
        if let Ok(frames) = &estop {
            report.frames += frames;
        }
        report.record(
            "emergencyStop from another party: -40007, latched, reset",
            estop.map(drop),
        );
    }
    let shutdown = op.result("arp.shutdown", json!({})).await.map(drop);
    report.record("arp.shutdown", shutdown);
    report.frames += op.frames;
    report
}

/// The checks that move nothing: listings, context, errors, a harmless call.
/// Returns the velocity_limit constraint, for the motion checks.
async fn listings(op: &mut Client, report: &mut Report) -> Option<Value> {
    report.record("arp.listTools: the mobile-base tools", tools(op).await);
    let constraints = constraints(op).await;
    let velocity = constraints
        .as_ref()
        .ok()
        .and_then(|l| l.iter().find(|c| c["type"] == "velocity_limit").cloned());
    report.record(
        "arp.listConstraints / arp.getConstraint",
        constraints.map(drop),
    );
    report.record(
        "context: list, subscribe, update, unsubscribe",
        context(op).await,
    );
    report.record(
        "errors: -32700 -32600 -32601 -32602 -40003 -40008, 64 KiB cap",
        errors(op).await,
    );
    let list = op
        .result(
            "arp.callTool",
            json!({"name": "list_locations", "arguments": {}}),
        )
        .await
        .and_then(|r| {
            ensure!(r["state"] == "completed", "state {}", r["state"]);
            Ok(())
        });
    report.record("callTool list_locations", list);
    velocity
}

async fn tools(op: &mut Client) -> Result<(), String> {
    let r = op.result("arp.listTools", json!({})).await?;
    let tools = r["tools"].as_array().ok_or("no tools")?;
    for name in TOOLS {
        ensure!(
            tools.iter().any(|t| t["name"] == name),
            "tool {name} missing"
        );
    }
    for t in tools {
        jsonschema::validator_for(&t["parameters"])
            .map_err(|e| format!("{}: parameters are not a JSON Schema: {e}", t["name"]))?;
    }
    Ok(())
}

async fn constraints(op: &mut Client) -> Result<Vec<Value>, String> {
    let r = op.result("arp.listConstraints", json!({})).await?;
    let list = r["constraints"].as_array().ok_or("no constraints")?.clone();
    for kind in ["velocity_limit", "rate_limit", "emergency_stop"] {
        ensure!(
            list.iter().any(|c| c["type"] == kind),
            "constraint {kind} missing"
        );
    }
    for c in &list {
        let one = op
            .result("arp.getConstraint", json!({"name": c["name"]}))
            .await?;
        ensure!(
            &one == c,
            "getConstraint {} differs from the list",
            c["name"]
        );
    }
    Ok(list)
}

async fn context(op: &mut Client) -> Result<(), String> {
    let r = op.result("arp.listContext", json!({})).await?;
    let sources = r["sources"].as_array().ok_or("no sources")?;
    ensure!(
        sources.iter().any(|s| s["name"] == "status"),
        "no status source"
    );
    let sub = op
        .result(
            "arp.subscribeContext",
            json!({"name": "status", "maxRate": 2}),
        )
        .await?;
    ensure!(sub["subscribed"] == true, "not subscribed: {sub}");
    let update = op.message("arp.contextUpdate").await?;
    ensure!(
        update["params"]["name"] == "status",
        "update for {}",
        update["params"]["name"]
    );
    let un = op
        .result("arp.unsubscribeContext", json!({"name": "status"}))
        .await?;
    ensure!(un["subscribed"] == false, "still subscribed: {un}");
    if sources.iter().any(|s| s["name"] == "odometry") {
        op.result(
            "arp.subscribeContext",
            json!({"name": "odometry", "maxRate": 10}),
        )
        .await?;
        let pose = op.message("arp.contextUpdate").await?;
        ensure!(
            pose["params"]["name"] == "odometry",
            "expected odometry: {pose}"
        );
        op.result("arp.unsubscribeContext", json!({"name": "odometry"}))
            .await?;
    }
    Ok(())
}

async fn errors(op: &mut Client) -> Result<(), String> {
    op.raw_error("{oops", -32700).await?;
    op.raw_error(
        r#"[{"jsonrpc":"2.0","id":1,"method":"arp.listTools"}]"#,
        -32600,
    )
    .await?;
    op.raw_error(r#"{"id":"x","method":"arp.listTools"}"#, -32600)
        .await?;
    op.raw_error(
        r#"{"jsonrpc":"2.0","id":"y","method":"arp.nonsense"}"#,
        -32601,
    )
    .await?;
    op.error(
        "arp.callTool",
        json!({"name": "drive", "arguments": {"linear": "fast", "angular": 0, "durationSecs": 1}}),
        -32602,
    )
    .await?;
    op.error(
        "arp.callTool",
        json!({"name": "no_such_tool", "arguments": {}}),
        -40003,
    )
    .await?;
    op.error(
        "arp.subscribeContext",
        json!({"name": "no_such_source"}),
        -40008,
    )
    .await?;
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":"big","method":"arp.listTools","params":{{"pad":"{}"}}}}"#,
        "x".repeat(65 * 1024)
    );
    op.raw_error(&big, -32600).await?;
    Ok(())
}

/// The viewer's client: refused a drive. Returns the frames it validated.
async fn viewer_may_not_move(url: &str, token: &str) -> Result<usize, String> {
    let mut v = connect(url, Some(token)).await?;
    v.initialize().await?;
    let refused = v
        .error("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.1, "angular": 0, "durationSecs": 0.5}}), -40001)
        .await?;
    ensure!(
        refused["error"]["data"]["reason"] == "forbidden",
        "reason: {refused}"
    );
    Ok(v.frames)
}

async fn drive(op: &mut Client) -> Result<(), String> {
    op.forget_progress();
    let id = op
        .request("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.1, "angular": 0.0, "durationSecs": 0.5}}))
        .await?;
    let progress = op.message("arp.toolProgress").await?;
    let done = op.response(&id).await?;
    ensure!(done["result"]["state"] == "completed", "drive: {done}");
    ensure!(
        progress["params"]["callId"] == done["result"]["callId"],
        "progress names another call"
    );
    Ok(())
}

async fn velocity_limit(op: &mut Client, velocity: Option<&Value>) -> Result<(), String> {
    let max = velocity
        .and_then(|c| c["parameters"]["max_linear"].as_f64())
        .ok_or("no max_linear")?;
    let action = velocity.map(|c| c["violation_action"].clone());
    let v = op
        .call("arp.callTool", json!({"name": "drive", "arguments": {"linear": max * 2.0, "angular": 0.0, "durationSecs": 0.2}}))
        .await?;
    match action.as_ref().and_then(Value::as_str) {
        Some("reject") => {
            ensure!(v["error"]["code"] == -40001, "over the limit: {v}");
            ensure!(
                v["error"]["data"]["constraint"] == "velocity_limit",
                "constraint: {v}"
            );
        }
        Some("clamp") => ensure!(v["result"]["state"] == "completed", "clamped drive: {v}"),
        other => return Err(format!("violation_action {other:?}")),
    }
    Ok(())
}

async fn cancel(op: &mut Client) -> Result<(), String> {
    op.forget_progress();
    let id = op
        .request("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.05, "angular": 0.0, "durationSecs": 10.0}}))
        .await?;
    let call = op.message("arp.toolProgress").await?["params"]["callId"].clone();
    let c = op.result("arp.cancelTool", json!({"callId": call})).await?;
    ensure!(c["cancelled"] == true, "cancelTool: {c}");
    let done = op.response(&id).await?;
    ensure!(
        done["result"]["state"] == "cancelled",
        "cancelled drive: {done}"
    );
    Ok(())
}

/// Another party's emergency stop mid-drive. Returns the frames its client
/// validated.
async fn emergency_stop(op: &mut Client, options: &Options) -> Result<usize, String> {
    op.forget_progress();
    let id = op
        .request("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.05, "angular": 0.0, "durationSecs": 10.0}}))
        .await?;
    op.message("arp.toolProgress").await?;
    let mut other = connect(
        &options.url,
        options
            .viewer_token
            .as_deref()
            .or(options.operator_token.as_deref()),
    )
    .await?;
    if options.viewer_token.is_some() {
        other.initialize().await?;
    }
    let stopped = other
        .result("arp.emergencyStop", json!({"reason": "conformance"}))
        .await?;
    ensure!(stopped["stopped"] == true, "emergencyStop: {stopped}");
    let failed = op.response(&id).await?;
    ensure!(failed["error"]["code"] == -40007, "running call: {failed}");
    ensure!(
        failed["error"]["data"]["state"] == "failed",
        "state: {failed}"
    );
    op.message("arp.emergencyStop").await?;
    op.error("arp.callTool", json!({"name": "drive", "arguments": {"linear": 0.05, "angular": 0.0, "durationSecs": 0.2}}), -40007)
        .await?;
    let reset = op
        .result(
            "arp.callTool",
            json!({"name": "reset_emergency_stop", "arguments": {}}),
        )
        .await?;
    ensure!(reset["state"] == "completed", "reset: {reset}");
    Ok(other.frames)
}
