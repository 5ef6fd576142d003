//! A scripted signalling server on 127.0.0.1:0: it accepts the agent's
//! socket, logs the robot in (register, PKI challenge, verified) and reads
//! what the agent sends, every spec message checked against the schema.
//! [`agent`] puts the real agent (signalling client, peer manager, ARP
//! server) behind it.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use ring::signature::{UnparsedPublicKey, ED25519};
use serde_json::{json, Value};
use signalling_protocol::arp::FRAME_TYPE;
use signalling_protocol::schema::SchemaValidator;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::WAIT;
use crate::arp::ArpServer;
use crate::config::ReconnectConfig;
use crate::identity::{KeyType, RobotKey};
use crate::peer::PeerManager;
use crate::session::Shared;
use crate::signalling::{self, SignallingOptions, INBOUND_CAPACITY};
use crate::tickets::TicketCheck;

/// The server's side of the agent's socket.
pub type Socket = WebSocketStream<TcpStream>;

/// A server message of `kind` (no `payload` member when `payload` is null).
pub fn envelope(kind: &str, payload: Value) -> Value {
    let mut m = json!({
        "type": kind, "version": "0.5", "id": uuid::Uuid::new_v4().to_string(),
        "timestamp": "2026-01-06T12:00:00Z",
    });
    if !payload.is_null() {
        m["payload"] = payload;
    }
    m
}

/// Sends one message to the agent.
pub async fn send(ws: &mut Socket, message: &Value) {
    ws.send(Message::text(message.to_string()))
        .await
        .expect("send");
}

/// Accepts the agent's next socket.
pub async fn accept(listener: &TcpListener) -> Socket {
    let (tcp, _) = tokio::time::timeout(WAIT, listener.accept())
        .await
        .expect("agent connects in time")
        .expect("accept");
    tokio_tungstenite::accept_async(tcp).await.expect("upgrade")
}

/// The agent's next text message; spec messages are schema-checked here
/// (`arp.frame`s carry ARP, which the ARP tests check against its own schema).
pub async fn next_text(ws: &mut Socket) -> Value {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("message in time")
            .expect("open")
            .expect("frame");
        if let Message::Text(text) = frame {
            let value: Value = serde_json::from_str(&text).expect("JSON");
            if value["type"] != FRAME_TYPE {
                if let Err(e) = SchemaValidator::shared().validate(&value) {
                    panic!("agent sent a message that breaks the spec: {e}\n{value}");
                }
            }
            return value;
        }
    }
}

/// register → challenge → response → verified, on an accepted socket; the
/// response's signature is checked against `key` when given. Returns the
/// register message.
pub async fn login(ws: &mut Socket, robot: &str, key: Option<&RobotKey>) -> Value {
    let register = next_text(ws).await;
    assert_eq!(register["type"], "signalling.register");
    assert_eq!(register["payload"]["agentId"], robot);
    let challenge_bytes = [7u8; 32];
    let challenge = envelope(
        "signalling.pki_challenge",
        json!({"challenge": STANDARD.encode(challenge_bytes)}),
    );
    send(ws, &challenge).await;
    let response = next_text(ws).await;
    assert_eq!(response["type"], "signalling.pki_response");
    assert_eq!(response["correlationId"], challenge["id"]);
    if let Some(key) = key {
        let signature = response["payload"]["signature"]
            .as_str()
            .and_then(|s| STANDARD.decode(s).ok())
            .expect("base64 signature");
        let public = STANDARD.decode(key.enrollment_public_key()).expect("key");
        UnparsedPublicKey::new(&ED25519, &public)
            .verify(&challenge_bytes, &signature)
            .expect("signature over the decoded challenge bytes");
    }
    let mut verified = envelope("signalling.pki_verified", json!({"agentId": robot}));
    verified["correlationId"] = response["id"].clone();
    send(ws, &verified).await;
    register
}

/// Accepts the agent's next socket and logs `robot` in; returns the socket
/// and the register message.
pub async fn accept_login(listener: &TcpListener, robot: &str) -> (Socket, Value) {
    let mut ws = accept(listener).await;
    let register = login(&mut ws, robot, None).await;
    (ws, register)
}

/// Signalling options for `robot` against `listener`: a fresh Ed25519 key,
/// quick reconnects, ARP declared.
pub fn options(listener: &TcpListener, robot: &str) -> SignallingOptions {
    SignallingOptions {
        urls: vec![format!("ws://{}/ws", listener.local_addr().expect("addr"))],
        robot_id: robot.into(),
        key: Arc::new(RobotKey::generate(KeyType::Ed25519).expect("key")),
        certificate: None,
        reconnect: ReconnectConfig {
            initial_delay_ms: 10,
            max_delay_ms: 50,
        },
        ca_file: None,
        arp: true,
    }
}

/// The real agent behind a scripted server, logged in: its signalling
/// client, and a peer manager that serves `arp` through the gateway.
pub struct Agent {
    /// Where the agent connects again after its socket is lost.
    pub listener: TcpListener,
    pub ws: Socket,
    /// The register message of the first login.
    pub register: Value,
    peers: JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.peers.abort();
    }
}

/// Starts the agent as `robot` (tickets checked by `check` when given) and
/// logs it in.
pub async fn agent(
    robot: &str,
    shared: Shared,
    arp: ArpServer,
    check: Option<Arc<TicketCheck>>,
) -> Agent {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (in_tx, in_rx) = mpsc::channel(INBOUND_CAPACITY);
    let out = signalling::spawn_checked(options(&listener, robot), check, in_tx);
    let manager = PeerManager::new(&super::browser::loopback(), out, shared)
        .expect("manager")
        .with_arp(arp);
    let peers = tokio::spawn(manager.run(in_rx));
    let (ws, register) = accept_login(&listener, robot).await;
    Agent {
        listener,
        ws,
        register,
        peers,
    }
}
