//! arp-bridge `--mode mcp` against the real server's gateway and the real robot-agent (sim),
//! the bridge being the library the binary runs, on an in-memory stdin/stdout:
//! - `--token-file`: a token that ends (revoked here; expiry closes the same way, 4003) does
//!   not end the bridge. The host's calls meanwhile fail naming the cause (`unauthorized`);
//!   once the file holds a fresh token, the next call connects again with it and works.
//! - elicitation: a host that can ask its user confirms a call the robot wants confirmed
//!   (policy `client`); the confirmer on record is the authenticated subject, set by the
//!   server.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_server_tests::server::{self, Running};
use arp_bridge::token::TokenSource;
use arp_bridge::ws::Target;
use arp_bridge::{Config, Exit, Mode};
use serde_json::{json, Value};
use signalling_protocol::arp::ConfirmationPolicy;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};

const ADMIN: &str = "bridge-token-admin";
const ROBOT: &str = "robot-bridge-token";
const SUBJECT: &str = "bridge-operator";
const WAIT: Duration = Duration::from_secs(20);

/// The host's end of the bridge's stdin/stdout.
struct Host {
    stdin: DuplexStream,
    lines: Lines<BufReader<DuplexStream>>,
    backlog: VecDeque<Value>,
    bridge: tokio::task::JoinHandle<Exit>,
}

impl Host {
    fn start(running: &Running, token_file: &Path) -> Host {
        let config = Config {
            target: Target {
                url: running.base.replace("http://", "ws://") + &format!("/v1/robots/{ROBOT}/arp"),
                token: TokenSource::File(token_file.to_path_buf()),
                ca_file: None,
                connect_timeout: Duration::from_secs(10),
            },
            mode: Mode::Mcp,
        };
        let (stdin, bridge_in) = tokio::io::duplex(1 << 20);
        let (bridge_out, stdout) = tokio::io::duplex(1 << 20);
        let bridge = tokio::spawn(arp_bridge::run(
            config,
            BufReader::new(bridge_in),
            bridge_out,
        ));
        Host {
            stdin,
            lines: BufReader::new(stdout).lines(),
            backlog: VecDeque::new(),
            bridge,
        }
    }

    async fn send(&mut self, message: Value) {
        let line = message.to_string() + "\n";
        self.stdin.write_all(line.as_bytes()).await.expect("write");
    }

    /// The next line `pick` accepts (others kept for later).
    async fn find(&mut self, pick: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&pick) {
            return self.backlog.remove(i).expect("present");
        }
        loop {
            let line = tokio::time::timeout(WAIT, self.lines.next_line())
                .await
                .expect("a line from the bridge in time")
                .expect("read")
                .expect("the bridge's stdout ended");
            let value: Value = serde_json::from_str(&line).expect("JSON");
            if pick(&value) {
                return value;
            }
            self.backlog.push_back(value);
        }
    }

    async fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        self.find(|v| v["id"] == json!(id) && v.get("method").is_none())
            .await
    }

    async fn notification(&mut self, method: &str, pick: impl Fn(&Value) -> bool) -> Value {
        self.find(|v| v["method"] == method && v.get("id").is_none() && pick(v))
            .await
    }
}

fn write_token(path: &PathBuf, token: &str) {
    // As a token refresher would: a new file moved into place.
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, format!("{token}\n")).expect("write");
    std::fs::rename(&fresh, path).expect("rename");
}

async fn revoke_tokens_of(running: &Running, subject: &str) {
    let listed = running
        .admin(reqwest::Method::GET, "/v1/tokens", None)
        .await;
    for token in listed.as_array().expect("tokens") {
        if token["subject"] == subject {
            let id = token["tokenId"].as_str().expect("tokenId");
            let path = format!("/v1/tokens/{id}");
            running.admin(reqwest::Method::DELETE, &path, None).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_replaced_through_the_file_without_ending_the_bridge() {
    let running = server::start(ADMIN, |_, _| {}).await;
    let (config_dir, _) = running.enroll(ROBOT).await;
    let first = running.client_token(ROBOT, SUBJECT, "operator").await;
    let agent = running.agent(ROBOT, config_dir, |_| {});
    running.wait_online(ROBOT).await;
    let token_file = running.dir().join("arp-token");
    write_token(&token_file, &first);

    let mut host = Host::start(&running, &token_file);
    let init = json!({ "protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": { "name": "bridge_token.rs", "version": "0" } });
    let answer = host.call(1, "initialize", init).await;
    assert!(answer["result"]["serverInfo"].is_object(), "{answer}");
    let list = json!({ "name": "list_locations", "arguments": {} });
    let listed = host.call(2, "tools/call", list.clone()).await;
    assert_eq!(listed["result"]["isError"], false, "{listed}");

    // The token revoked: the gateway ends the connection; the bridge stays.
    revoke_tokens_of(&running, SUBJECT).await;
    let closed = host.notification("arp-bridge.closed", |_| true).await;
    assert_eq!(closed["params"]["code"], 4003, "{closed}");
    assert_eq!(closed["params"]["reconnects"], true, "{closed}");
    // No new token yet: the host's call fails naming the cause and the file.
    let refused = host.call(3, "tools/call", list.clone()).await;
    assert_eq!(refused["error"]["code"], -32603, "{refused}");
    assert_eq!(
        refused["error"]["data"]["reason"], "unauthorized",
        "{refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("arp-token"), "{message}");
    // Requests that need no robot are served as ever.
    let pong = host.call(4, "ping", json!({})).await;
    assert_eq!(pong["result"], json!({}), "{pong}");

    // A fresh token in the file: the next call connects again with it and works.
    let made = running
        .admin(
            reqwest::Method::POST,
            "/v1/tokens",
            Some(json!({ "subject": SUBJECT })),
        )
        .await;
    write_token(&token_file, made["token"].as_str().expect("token"));
    let listed = host.call(5, "tools/call", list).await;
    assert_eq!(listed["result"]["isError"], false, "{listed}");
    let ready = host
        .notification("arp-bridge.ready", |v| v["params"]["reconnected"] == true)
        .await;
    assert_eq!(ready["params"]["ok"], true, "{ready}");

    // stdin's end still ends the bridge cleanly.
    drop(host.stdin);
    let exit = tokio::time::timeout(WAIT, host.bridge)
        .await
        .expect("the bridge ends in time")
        .expect("joined");
    assert_eq!(exit, Exit::Eof);
    agent.abort();
}

/// The host declares elicitation; the robot asks a person before save_location and lets the
/// client answer: declined, the call fails (-40006); accepted, it runs, and the audit names
/// the subject the server authenticated as the confirmer (not what the bridge says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_through_the_bridge_is_on_record_as_the_subject() {
    let running = server::start(ADMIN, |_, _| {}).await;
    let (config_dir, _) = running.enroll(ROBOT).await;
    let token = running.client_token(ROBOT, SUBJECT, "operator").await;
    let agent = running.agent(ROBOT, config_dir, |c| {
        c.arp.confirm.policy = ConfirmationPolicy::Client;
        c.arp.confirm.tools.insert("save_location".into(), true);
    });
    running.wait_online(ROBOT).await;
    let token_file = running.dir().join("arp-token");
    write_token(&token_file, &token);
    let mut host = Host::start(&running, &token_file);
    let init = json!({ "protocolVersion": "2025-06-18", "capabilities": { "elicitation": {} },
                       "clientInfo": { "name": "bridge_gateway.rs", "version": "0" } });
    host.call(1, "initialize", init).await;

    let save = json!({ "name": "save_location", "arguments": { "name": "dock" } });
    for (id, accept) in [(2, false), (3, true)] {
        host.send(json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": save }))
            .await;
        let asked = host
            .find(|v| v["method"] == "elicitation/create" && v.get("id").is_some())
            .await;
        let message = asked["params"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("save_location"), "{asked}");
        let result = if accept {
            json!({ "action": "accept", "content": { "confirm": true } })
        } else {
            json!({ "action": "decline" })
        };
        host.send(json!({ "jsonrpc": "2.0", "id": asked["id"], "result": result }))
            .await;
        let answer = host
            .find(|v| v["id"] == json!(id) && v.get("method").is_none())
            .await;
        let result = &answer["result"];
        assert_eq!(result["isError"], !accept, "{answer}");
        if !accept {
            assert_eq!(
                result["structuredContent"]["error"]["code"], -40006,
                "{answer}"
            );
        }
    }
    let record = confirmed_record(&running, "save_location").await;
    assert_eq!(
        record["confirmedBy"],
        format!("{SUBJECT} via client"),
        "{record}"
    );
    drop(host.stdin);
    agent.abort();
}

/// The audit record of a completed, confirmed call of `tool` (written in batches: polled,
/// bounded).
async fn confirmed_record(running: &Running, tool: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let path = format!("/v1/robots/{ROBOT}/audit?limit=100");
        let audit = running.admin(reqwest::Method::GET, &path, None).await;
        let found = audit["records"].as_array().and_then(|records| {
            records
                .iter()
                .find(|r| r["tool"] == tool && r["confirmedBy"].is_string())
                .cloned()
        });
        if let Some(record) = found {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no confirmed {tool}: {audit}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
