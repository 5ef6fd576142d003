//! How to talk to each system under test: our server through its real protocol (verified
//! robots, token clients, sessions), the id-routing relays (bare Rust, Node.js, Python), and
//! matchbox_server through its own protocol.

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Waits on a single reply are bounded so a broken target fails the run instead of hanging it.
const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Our signalling server.
    Ours,
    /// A relay that routes `{"to": id}` messages and acks with `{"welcome": id}`.
    Relay,
    Matchbox,
}

/// Everything a worker needs to reach a target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetInfo {
    pub name: String,
    pub kind: Kind,
    pub ws_url: String,
    /// Ours, several nodes: where robots connect, when not `ws_url` (clients' node).
    #[serde(default)]
    pub robot_ws_url: Option<String>,
    /// Ours: the client token every bench client uses.
    pub client_token: Option<String>,
    /// Ours: PKCS#8 of the robots' Ed25519 key (base64).
    pub ed25519_pkcs8: Option<String>,
    /// Ours: PKCS#8 of the storm robots' P-256 key (base64).
    pub p256_pkcs8: Option<String>,
}

/// Signs PKI challenges for bench robots.
pub enum Signer {
    Ed25519(Ed25519KeyPair),
    P256(EcdsaKeyPair),
}

impl Signer {
    pub fn from_info(info: &TargetInfo, p256: bool) -> anyhow::Result<Signer> {
        let field = if p256 {
            &info.p256_pkcs8
        } else {
            &info.ed25519_pkcs8
        };
        let pkcs8 = STANDARD.decode(field.as_deref().context("no robot key")?)?;
        Ok(if p256 {
            Signer::P256(
                EcdsaKeyPair::from_pkcs8(
                    &ECDSA_P256_SHA256_ASN1_SIGNING,
                    &pkcs8,
                    &SystemRandom::new(),
                )
                .map_err(|e| anyhow::anyhow!("P-256 key: {e}"))?,
            )
        } else {
            Signer::Ed25519(
                Ed25519KeyPair::from_pkcs8(&pkcs8)
                    .map_err(|e| anyhow::anyhow!("Ed25519 key: {e}"))?,
            )
        })
    }

    fn sign(&self, message: &[u8]) -> anyhow::Result<Vec<u8>> {
        Ok(match self {
            Signer::Ed25519(key) => key.sign(message).as_ref().to_vec(),
            Signer::P256(key) => key
                .sign(&SystemRandom::new(), message)
                .map_err(|e| anyhow::anyhow!("sign: {e}"))?
                .as_ref()
                .to_vec(),
        })
    }
}

/// How a bench socket reads. tungstenite zero-fills its read buffer up to its capacity
/// (128 KiB by default) before every read, and a new socket's first read faults all of it
/// in: in a login storm that made the load generator cost as much CPU per login as the
/// server. Sockets that log in and wait (storm, capacity) read through a small buffer;
/// relay ends keep the default, the same for every relay measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    Relay,
    Small,
}

/// The read buffer of `Reads::Small`: bigger than anything a waiting socket receives.
const SMALL_READ_BUFFER: usize = 4 * 1024;

pub async fn connect(url: &str, reads: Reads) -> anyhow::Result<Socket> {
    let config = (reads == Reads::Small).then(|| {
        tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(SMALL_READ_BUFFER)
    });
    let (socket, _) = tokio::time::timeout(
        REPLY_TIMEOUT,
        tokio_tungstenite::connect_async_with_config(url, config, true),
    )
    .await
    .context("connect timed out")?
    .with_context(|| format!("connect {url}"))?;
    Ok(socket)
}

/// The next text frame as JSON (pings are answered by tungstenite itself). The time limit
/// is for the text frame: the server's pings do not extend it, so a message that never
/// comes fails the run instead of holding it forever.
pub async fn next_json(socket: &mut Socket) -> anyhow::Result<Value> {
    next_json_by(socket, tokio::time::Instant::now() + REPLY_TIMEOUT).await
}

/// The next text frame as JSON, by `deadline`.
pub async fn next_json_by(
    socket: &mut Socket,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Value> {
    loop {
        let frame = tokio::time::timeout_at(deadline, socket.next())
            .await
            .context("no reply in time")?
            .context("socket closed")??;
        if let Message::Text(text) = frame {
            return Ok(serde_json::from_str(&text)?);
        }
    }
}

pub async fn expect_type(socket: &mut Socket, kind: &str) -> anyhow::Result<Value> {
    let message = next_json(socket).await?;
    if message["type"] != kind {
        bail!("expected {kind}, got {message}");
    }
    Ok(message)
}

pub fn envelope(kind: &str, id: &str, payload: Value) -> Value {
    json!({"type": kind, "version": "0.5", "id": id, "timestamp": "2026-01-01T00:00:00Z", "payload": payload})
}

/// Robot login on our server: register → challenge → signed response → verified →
/// welcome. Robots get a welcome only when they ask (docs/protocol.md); this one asks, as
/// robot-agent does.
pub async fn robot_login(
    info: &TargetInfo,
    robot_id: &str,
    signer: &Signer,
    reads: Reads,
) -> anyhow::Result<Socket> {
    robot_login_declaring(info, robot_id, signer, reads, json!({})).await
}

/// `robot_login` with more in the register's `metadata` (`{"arp": "0.1.0"}`: the robot
/// serves ARP through the gateway).
pub async fn robot_login_declaring(
    info: &TargetInfo,
    robot_id: &str,
    signer: &Signer,
    reads: Reads,
    declared: Value,
) -> anyhow::Result<Socket> {
    let url = info.robot_ws_url.as_deref().unwrap_or(&info.ws_url);
    let mut socket = connect(url, reads).await?;
    let register = register_message(robot_id, declared);
    socket
        .send(Message::Text(register.to_string().into()))
        .await?;
    let challenge = expect_type(&mut socket, "signalling.pki_challenge").await?;
    let response = pki_response(&challenge, signer)?;
    socket
        .send(Message::Text(response.to_string().into()))
        .await?;
    expect_type(&mut socket, "signalling.pki_verified").await?;
    expect_type(&mut socket, "signalling.welcome").await?;
    Ok(socket)
}

/// A robot's `register`, asking for a welcome as robot-agent does, with `metadata`'s
/// fields besides.
pub fn register_message(robot_id: &str, metadata: Value) -> Value {
    let mut all = serde_json::Map::new();
    all.insert("wantsWelcome".into(), Value::Bool(true));
    if let Value::Object(fields) = metadata {
        all.extend(fields);
    }
    envelope(
        "signalling.register",
        &uuid::Uuid::new_v4().to_string(),
        json!({"agentId": robot_id, "metadata": all}),
    )
}

/// The signed answer to a `signalling.pki_challenge`.
pub fn pki_response(challenge: &Value, signer: &Signer) -> anyhow::Result<Value> {
    let bytes = STANDARD.decode(
        challenge["payload"]["challenge"]
            .as_str()
            .context("challenge")?,
    )?;
    let mut response = envelope(
        "signalling.pki_response",
        &uuid::Uuid::new_v4().to_string(),
        json!({"signature": STANDARD.encode(signer.sign(&bytes)?)}),
    );
    response["correlationId"] = challenge["id"].clone();
    Ok(response)
}

/// A client socket on our server; returns it with its connectionId.
pub async fn client_login(info: &TargetInfo, reads: Reads) -> anyhow::Result<(Socket, String)> {
    let token = info.client_token.as_deref().context("no client token")?;
    let mut socket = connect(&format!("{}?token={token}", info.ws_url), reads).await?;
    let welcome = expect_type(&mut socket, "signalling.welcome").await?;
    let id = welcome["payload"]["connectionId"]
        .as_str()
        .context("connectionId")?
        .to_string();
    Ok((socket, id))
}

/// How messages of one pair are addressed.
#[derive(Debug, Clone)]
pub enum Route {
    Ours { robot_id: String, session: String },
    Relay { a: String, b: String },
    Matchbox { a: String, b: String },
}

/// Two connected ends: `a` plays the browser client, `b` the robot.
pub struct Pair {
    pub a: Socket,
    pub b: Socket,
    pub route: Route,
}

/// Sets up pair `index`: for ours a verified robot and a client with a session to it.
pub async fn open_pair(
    info: &TargetInfo,
    signer: Option<&Signer>,
    index: usize,
    tag: &str,
) -> anyhow::Result<Pair> {
    match info.kind {
        Kind::Ours => {
            let robot_id = format!("bench-{index}");
            let b =
                robot_login(info, &robot_id, signer.context("robot key")?, Reads::Relay).await?;
            let (a, session) = client_login(info, Reads::Relay).await?;
            let mut pair = Pair {
                a,
                b,
                route: Route::Ours {
                    robot_id,
                    session: session.clone(),
                },
            };
            let offer = offer_message(&pair.route, &session, 200)?;
            pair.a.send(Message::Text(offer.into())).await?;
            expect_type(&mut pair.b, "signalling.offer").await?;
            Ok(pair)
        }
        Kind::Relay => {
            let (a_id, b_id) = (format!("{tag}a{index}"), format!("{tag}b{index}"));
            let mut a = connect(&format!("{}?id={a_id}", info.ws_url), Reads::Relay).await?;
            let mut b = connect(&format!("{}?id={b_id}", info.ws_url), Reads::Relay).await?;
            for socket in [&mut a, &mut b] {
                let ack = next_json(socket).await?;
                if ack.get("welcome").is_none() {
                    bail!("relay did not acknowledge: {ack}");
                }
            }
            Ok(Pair {
                a,
                b,
                route: Route::Relay { a: a_id, b: b_id },
            })
        }
        Kind::Matchbox => {
            let room = format!("{}/{tag}room{index}", info.ws_url.trim_end_matches('/'));
            let mut a = connect(&room, Reads::Relay).await?;
            let a_id = matchbox_id(&mut a).await?;
            let mut b = connect(&room, Reads::Relay).await?;
            let b_id = matchbox_id(&mut b).await?;
            // The earlier peer hears of the later one; wait for it so both are in the room.
            loop {
                let event = next_json(&mut a).await?;
                if event.get("NewPeer").and_then(Value::as_str) == Some(b_id.as_str()) {
                    break;
                }
            }
            Ok(Pair {
                a,
                b,
                route: Route::Matchbox { a: a_id, b: b_id },
            })
        }
    }
}

async fn matchbox_id(socket: &mut Socket) -> anyhow::Result<String> {
    let event = next_json(socket).await?;
    event
        .get("IdAssigned")
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("expected IdAssigned, got {event}"))
}

/// Direction of a message within a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    AtoB,
    BtoA,
}

fn padding(size: usize, used: usize) -> String {
    "x".repeat(size.saturating_sub(used))
}

/// A message of about `size` bytes carrying `stamp` as its id: an ICE candidate from the
/// client or an SDP answer from the robot on ours; an addressed blob on the relays.
pub fn data_message(route: &Route, dir: Dir, stamp: u64, size: usize) -> anyhow::Result<String> {
    let id = format!("{stamp:0width$}", width = STAMP_DIGITS);
    let text = match (route, dir) {
        (Route::Ours { session, .. }, Dir::AtoB) => {
            let base = envelope(
                "signalling.ice_candidate",
                &id,
                json!({"connectionId": session, "candidate": "", "sdpMid": "0", "sdpMLineIndex": 0}),
            )
            .to_string();
            let mut message = serde_json::from_str::<Value>(&base)?;
            message["payload"]["candidate"] = Value::String(format!(
                "candidate:1 1 UDP 2130706431 127.0.0.1 9 typ host {}",
                padding(size, base.len() + 48)
            ));
            message.to_string()
        }
        (Route::Ours { session, .. }, Dir::BtoA) => {
            let base = envelope(
                "signalling.answer",
                &id,
                json!({"connectionId": session, "sdpType": "answer", "sdp": ""}),
            )
            .to_string();
            let mut message = serde_json::from_str::<Value>(&base)?;
            message["payload"]["sdp"] =
                Value::String(format!("v=0\r\n{}", padding(size, base.len() + 5)));
            message.to_string()
        }
        (Route::Relay { a, b }, dir) => {
            let to = if dir == Dir::AtoB { b } else { a };
            let base = json!({"to": to, "id": id, "data": ""}).to_string();
            json!({"to": to, "id": id, "data": padding(size, base.len())}).to_string()
        }
        (Route::Matchbox { a, b }, dir) => {
            let to = if dir == Dir::AtoB { b } else { a };
            let base =
                json!({"Signal": {"receiver": to, "data": {"id": id, "pad": ""}}}).to_string();
            json!({"Signal": {"receiver": to, "data": {"id": id, "pad": padding(size, base.len())}}}).to_string()
        }
    };
    Ok(text)
}

/// Width of the stamp in a data message: fixed, so every message of a run has the same size.
const STAMP_DIGITS: usize = 20;

/// A run's data messages, rendered once: each message is the text around its stamp.
///
/// Building every message through `serde_json` cost the load generator two to three times
/// more for our envelopes than for the relays' small objects, on the cores it shares with
/// the relay under test; a template costs the same for every target.
#[derive(Debug, Clone)]
pub struct DataTemplate {
    head: String,
    tail: String,
}

impl DataTemplate {
    pub fn new(route: &Route, dir: Dir, size: usize) -> anyhow::Result<Self> {
        let text = data_message(route, dir, 0, size)?;
        let marker = format!("\"id\":\"{:0width$}\"", 0, width = STAMP_DIGITS);
        let at = text
            .find(&marker)
            .ok_or_else(|| anyhow::anyhow!("no stamp in the data message: {text}"))?
            + 6;
        Ok(Self {
            head: text[..at].to_string(),
            tail: text[at + STAMP_DIGITS..].to_string(),
        })
    }

    pub fn render(&self, stamp: u64) -> String {
        use std::fmt::Write;
        let mut text = String::with_capacity(self.head.len() + STAMP_DIGITS + self.tail.len());
        text.push_str(&self.head);
        let _ = write!(text, "{stamp:0width$}", width = STAMP_DIGITS);
        text.push_str(&self.tail);
        text
    }
}

/// An offer opening session `session` (ours) or an offer-sized blob (relays).
pub fn offer_message(route: &Route, session: &str, size: usize) -> anyhow::Result<String> {
    match route {
        Route::Ours { robot_id, .. } => {
            let base = envelope(
                "signalling.offer",
                &uuid::Uuid::new_v4().to_string(),
                json!({"robotId": robot_id, "connectionId": session, "sdpType": "offer", "sdp": ""}),
            );
            let mut message = base.clone();
            message["payload"]["sdp"] = Value::String(format!(
                "v=0\r\n{}",
                padding(size, base.to_string().len() + 5)
            ));
            Ok(message.to_string())
        }
        other => data_message(other, Dir::AtoB, 0, size),
    }
}

/// The answer a robot sends to an offer for `session` (ours), or the reply blob (relays).
pub fn answer_message(route: &Route, session: &str, size: usize) -> anyhow::Result<String> {
    match route {
        Route::Ours { .. } => {
            let base = envelope(
                "signalling.answer",
                &uuid::Uuid::new_v4().to_string(),
                json!({"connectionId": session, "sdpType": "answer", "sdp": ""}),
            );
            let mut message = base.clone();
            message["payload"]["sdp"] = Value::String(format!(
                "v=0\r\n{}",
                padding(size, base.to_string().len() + 5)
            ));
            Ok(message.to_string())
        }
        other => data_message(other, Dir::BtoA, 0, size),
    }
}

/// Ends session `session` from the client side (ours only).
pub fn hangup_message(session: &str) -> String {
    envelope(
        "signalling.disconnected",
        &uuid::Uuid::new_v4().to_string(),
        json!({"connectionId": session, "reason": "closed"}),
    )
    .to_string()
}

/// The stamp a sender put in the first `"id":"…"` of a message.
pub fn stamp_of(text: &str) -> Option<u64> {
    let start = text.find("\"id\":\"")? + 6;
    let rest = &text[start..];
    let end = rest.find('"')?;
    rest[..end].parse().ok()
}

/// Answers a ticket's key exchange (`kx`) as robot-agent does, with a fresh X25519 public
/// key, so that the server MACs the session's later tickets as it would for a real agent.
pub fn key_exchange_answer(message: &Value) -> Option<String> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let ticket = message.pointer("/meta/session/ticket")?.as_str()?;
    let claims = URL_SAFE_NO_PAD.decode(ticket.split('.').nth(1)?).ok()?;
    let claims: Value = serde_json::from_slice(&claims).ok()?;
    claims.get("kx")?;
    let rng = ring::rand::SystemRandom::new();
    let ours =
        ring::agreement::EphemeralPrivateKey::generate(&ring::agreement::X25519, &rng).ok()?;
    Some(URL_SAFE_NO_PAD.encode(ours.compute_public_key().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_have_the_requested_size_and_stamp() {
        let routes = [
            Route::Ours {
                robot_id: "r".into(),
                session: "s".into(),
            },
            Route::Relay {
                a: "a".into(),
                b: "b".into(),
            },
            Route::Matchbox {
                a: "a".into(),
                b: "b".into(),
            },
        ];
        for route in &routes {
            for (dir, size) in [(Dir::AtoB, 250), (Dir::BtoA, 6000)] {
                let text = data_message(route, dir, 123456789, size).unwrap();
                assert!(
                    (size..size + 64).contains(&text.len()),
                    "{route:?} {dir:?}: {}",
                    text.len()
                );
                assert_eq!(stamp_of(&text), Some(123456789));
            }
        }
        for route in &routes {
            for (dir, size) in [(Dir::AtoB, 250), (Dir::BtoA, 6000)] {
                let template = DataTemplate::new(route, dir, size).unwrap();
                for stamp in [1, 123456789, u64::MAX] {
                    assert_eq!(
                        template.render(stamp),
                        data_message(route, dir, stamp, size).unwrap()
                    );
                    assert_eq!(stamp_of(&template.render(stamp)), Some(stamp));
                }
            }
        }
        let forwarded = r#"{"Signal":{"sender":"u","data":{"id":"42","pad":""}}}"#;
        assert_eq!(stamp_of(forwarded), Some(42));
    }
}
