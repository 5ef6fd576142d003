//! A stand-in robot: logs in as the bench's robots do (Ed25519 proof), declares ARP,
//! answers offers, echoes its sessions' frames back and sends frames of its own to every
//! session (viewers too), answers ARP calls (asking the program for a confirmation on some,
//! remembering idempotency keys as robot-agent does), and reconnects with robot-agent's
//! jittered backoff when cut. What it sees goes into the books: frames for a session that
//! is not its own, two controlling sessions at once, calls run twice.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::{envelope, frame_tag, parse_tag, Backoff, Shared};
use crate::target::{self, Reads, Signer, Socket};

/// A session the robot takes part in.
struct Session {
    controls: bool,
    /// A teleop session (frames both ways); else ARP.
    teleop: bool,
    seq: u64,
}

/// Runs robot `robot_id` until the run stops.
pub async fn run(shared: Arc<Shared>, robot_id: String, signer: Arc<Signer>) {
    let books = &shared.books;
    let mut backoff = Backoff::new();
    let mut cut: Option<(Instant, String)> = None;
    // Idempotency keys this robot has run: (subject|key) → the answer it gave.
    let mut remembered: HashMap<String, Value> = HashMap::new();
    let mut churn_at = shared.churn_deadline();
    while !shared.stopping() {
        let socket = match login(&shared, &robot_id, &signer).await {
            Ok(socket) => socket,
            Err(e) => {
                books.count("robots.login_failed");
                books.error(&format!("robot_login:{}", short(&e.to_string())));
                if cut.is_none() {
                    cut = Some((Instant::now(), shared.books.phases.current()));
                }
                backoff.wait(&shared).await;
                continue;
            }
        };
        backoff.reset();
        books.count("robots.logins");
        if let Some((since, phase)) = cut.take() {
            books.phases.back_online(&phase, since);
        }
        let ended = serve(&shared, &robot_id, socket, &mut remembered, &mut churn_at).await;
        if shared.stopping() {
            break;
        }
        books.count(&format!("robots.cut.{ended}"));
        cut = Some((Instant::now(), shared.books.phases.current()));
        backoff.wait(&shared).await;
    }
}

fn short(text: &str) -> String {
    text.split(':')
        .next()
        .unwrap_or(text)
        .chars()
        .take(40)
        .collect()
}

async fn login(shared: &Shared, robot_id: &str, signer: &Signer) -> anyhow::Result<Socket> {
    let mut socket = tokio::time::timeout(
        Duration::from_secs(5),
        target::connect(&shared.ws_url, Reads::Small),
    )
    .await
    .context("connect timed out")??;
    let register = envelope(
        "signalling.register",
        json!({"agentId": robot_id, "metadata": {"wantsWelcome": true, "arp": "0.1.0"}}),
    );
    socket.send(Message::text(register.to_string())).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let message = next_text(&mut socket, deadline).await?;
        match message["type"].as_str() {
            Some("signalling.pki_challenge") => {
                let bytes = STANDARD.decode(
                    message["payload"]["challenge"]
                        .as_str()
                        .context("challenge")?,
                )?;
                let signature = match signer {
                    Signer::Ed25519(key) => key.sign(&bytes).as_ref().to_vec(),
                    Signer::P256(_) => bail!("chaos robots use Ed25519"),
                };
                let mut response = envelope(
                    "signalling.pki_response",
                    json!({"signature": STANDARD.encode(signature)}),
                );
                response["correlationId"] = message["id"].clone();
                socket.send(Message::text(response.to_string())).await?;
            }
            Some("signalling.welcome") if message["payload"].get("iceServers").is_some() => {
                // The first welcome comes before the proof; the second after pki_verified.
            }
            Some("signalling.pki_verified") => {
                // Wait for the second welcome below.
                let next = next_text(&mut socket, deadline).await?;
                if next["type"] != "signalling.welcome" {
                    bail!("expected welcome after pki_verified, got {next}");
                }
                return Ok(socket);
            }
            Some("signalling.error") => bail!("login refused: {}", message["payload"]),
            _ => {}
        }
    }
}

async fn next_text(socket: &mut Socket, deadline: tokio::time::Instant) -> anyhow::Result<Value> {
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

/// Serves one login until the socket ends; says how it ended.
async fn serve(
    shared: &Shared,
    robot_id: &str,
    socket: Socket,
    remembered: &mut HashMap<String, Value>,
    churn_at: &mut Option<Instant>,
) -> &'static str {
    let books = &shared.books;
    let (mut sink, mut stream) = socket.split();
    let mut sessions: HashMap<String, Session> = HashMap::new();
    // Sessions that ended: frames for them may still arrive late, harmlessly.
    let mut ended: HashSet<String> = HashSet::new();
    // The last session events, shown with a breach: what the robot heard, in its order.
    let mut seen = Seen::default();
    // Confirmations asked: request id → (connectionId, call id, key, subject).
    let mut asked: HashMap<String, (String, Value, String)> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = shared.stop_signal();
    loop {
        let message = tokio::select! {
            _ = stop.changed() => {
                let _ = sink.close().await;
                return "stopped";
            }
            _ = tick.tick() => {
                if churn_at.is_some_and(|at| Instant::now() >= at) {
                    *churn_at = shared.churn_deadline();
                    let _ = sink.close().await;
                    books.count("robots.churned");
                    return "churn";
                }
                // Frames of its own to every teleop session (viewers included), 10 Hz.
                let mut out = Vec::new();
                for (id, session) in sessions.iter_mut().filter(|(_, s)| s.teleop) {
                    session.seq += 1;
                    out.push(ice(id, &frame_tag(id, session.seq, 0)));
                }
                for text in out {
                    if sink.send(Message::text(text)).await.is_err() {
                        return "send_failed";
                    }
                    books.count("frames.robot_sent");
                }
                continue;
            }
            message = stream.next() => message,
        };
        let text = match message {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(_))) | None => return "closed",
            Some(Ok(_)) => continue,
            Some(Err(_)) => return "error",
        };
        let Ok(message) = serde_json::from_str::<Value>(&text) else {
            books.breach("robot_got_bad_json", text.chars().take(200).collect());
            continue;
        };
        let kind = message["type"].as_str().unwrap_or("");
        let payload = &message["payload"];
        let session_id = payload["connectionId"].as_str().unwrap_or("").to_string();
        let role = message["meta"]["session"]["role"].as_str().unwrap_or("");
        let controls = matches!(role, "operator" | "owner");
        match kind {
            "signalling.offer" => {
                books.count("offers.robot_received");
                if payload["robotId"].as_str().is_some_and(|r| r != robot_id) {
                    books.breach("offer_for_another_robot", format!("{robot_id}: {message}"));
                }
                seen.note(format!("offer {session_id} {role}"));
                open_session(books, &mut sessions, &session_id, controls, true, &seen);
                let answer = envelope(
                    "signalling.answer",
                    json!({"connectionId": session_id, "sdpType": "answer", "sdp": "v=0\r\n"}),
                );
                if sink.send(Message::text(answer.to_string())).await.is_err() {
                    return "send_failed";
                }
            }
            "signalling.ice_candidate" => {
                let candidate = payload["candidate"].as_str().unwrap_or("");
                if !sessions.contains_key(&session_id) {
                    if !ended.contains(&session_id) {
                        books.breach(
                            "frame_to_a_non_party",
                            format!("robot {robot_id} got a frame of {session_id}"),
                        );
                    }
                    continue;
                }
                match parse_tag(candidate) {
                    Some((tagged, seq, stamp)) if tagged == session_id => {
                        books.count("frames.robot_received");
                        // Echo the client's stamp: its round trip is the relay's.
                        let echo = ice(&session_id, &frame_tag(&session_id, seq, stamp));
                        if sink.send(Message::text(echo)).await.is_err() {
                            return "send_failed";
                        }
                    }
                    _ => books.breach(
                        "frame_to_a_non_party",
                        format!("robot {robot_id}, session {session_id}: {candidate}"),
                    ),
                }
            }
            "signalling.disconnected" => {
                let reason = payload["details"]["reason"].as_str().unwrap_or("");
                seen.note(format!("disconnected {session_id} {reason}"));
                if sessions.remove(&session_id).is_some() {
                    books.count("sessions.robot_told_end");
                }
                ended.insert(session_id);
            }
            "arp.frame" => {
                if !sessions.contains_key(&session_id) {
                    if ended.contains(&session_id) {
                        books.count("arp.robot_frame_after_end");
                        continue;
                    }
                    seen.note(format!("arp.frame(new) {session_id} {role}"));
                    open_session(books, &mut sessions, &session_id, controls, false, &seen);
                }
                let answer = arp_answer(shared, robot_id, &message, remembered, &mut asked);
                for frame in answer {
                    if sink.send(Message::text(frame.to_string())).await.is_err() {
                        return "send_failed";
                    }
                }
            }
            "signalling.error" => {
                let code = payload["code"].as_str().unwrap_or("?");
                let reason = payload["details"]["reason"].as_str().unwrap_or("");
                books.error(&format!("robot:{code}/{reason}"));
            }
            _ => {}
        }
    }
}

/// The last few session events a robot heard, with their time since its login.
struct Seen {
    since: Instant,
    events: VecDeque<String>,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            since: Instant::now(),
            events: VecDeque::new(),
        }
    }
}

impl Seen {
    const KEPT: usize = 12;

    fn note(&mut self, event: String) {
        if self.events.len() == Self::KEPT {
            self.events.pop_front();
        }
        let at = self.since.elapsed().as_millis();
        self.events.push_back(format!("+{at}ms {event}"));
    }
}

fn open_session(
    books: &super::Books,
    sessions: &mut HashMap<String, Session>,
    id: &str,
    controls: bool,
    teleop: bool,
    seen: &Seen,
) {
    sessions.insert(
        id.to_string(),
        Session {
            controls,
            teleop,
            seq: 0,
        },
    );
    let controllers = sessions.values().filter(|s| s.controls).count() as u64;
    books.controllers_seen(controllers);
    if controllers > 1 {
        let ids: Vec<&String> = sessions
            .iter()
            .filter(|(_, s)| s.controls)
            .map(|(id, _)| id)
            .collect();
        books.breach(
            "two_controllers_of_one_robot",
            format!("{ids:?}; heard: {:?}", seen.events),
        );
    }
}

fn ice(session: &str, tag: &str) -> String {
    envelope(
        "signalling.ice_candidate",
        json!({"connectionId": session, "candidate": format!("candidate:1 1 UDP 1 127.0.0.1 9 typ host {tag}"), "sdpMid": "0", "sdpMLineIndex": 0}),
    )
    .to_string()
}

/// The robot's frames in answer to one `arp.frame`.
fn arp_answer(
    shared: &Shared,
    robot_id: &str,
    message: &Value,
    remembered: &mut HashMap<String, Value>,
    asked: &mut HashMap<String, (String, Value, String)>,
) -> Vec<Value> {
    let books = &shared.books;
    let connection = message["payload"]["connectionId"].clone();
    let frame = &message["payload"]["frame"];
    let subject = message["meta"]["session"]["subject"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let reply = |frame: Value, meta: Option<Value>| {
        let mut answer = envelope(
            "arp.frame",
            json!({"connectionId": connection, "frame": frame}),
        );
        if let Some(meta) = meta {
            answer["meta"] = meta;
        }
        answer
    };
    // An answer to a confirmation this robot asked for.
    if frame.get("method").is_none() {
        let Some(request) = frame["id"].as_str() else {
            return Vec::new();
        };
        let Some((call_subject, call_id, key)) = asked.remove(request) else {
            books.breach(
                "robot_got_an_unsolicited_answer",
                format!("{robot_id}: {frame}"),
            );
            return Vec::new();
        };
        if frame["result"]["confirmed"] != true {
            books.count("arp.confirmations_denied");
            return vec![reply(
                json!({"jsonrpc": "2.0", "id": call_id, "error": {"code": -40006, "message": "confirmation denied"}}),
                None,
            )];
        }
        books.count("arp.confirmations_given");
        let confirmed_by = frame["result"]["confirmedBy"].as_str().unwrap_or("");
        if !confirmed_by.ends_with(" via client") || !confirmed_by.starts_with(&call_subject) {
            books.breach(
                "confirmation_by_someone_else",
                format!("{robot_id}: {confirmed_by}"),
            );
        }
        return vec![reply(
            run_call(books, &call_subject, &key, &call_id, remembered),
            None,
        )];
    }
    let Some(id) = frame.get("id").cloned() else {
        return Vec::new();
    };
    let method = frame["method"].as_str().unwrap_or("");
    let meta = key_exchange(message).map(|half| json!({"ticketKey": half}));
    match method {
        "arp.initialize" => vec![reply(
            json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": "0.1.0",
                "serverInfo": {"name": "chaos-robot", "version": "1"},
                "capabilities": {"tools": true, "context": true, "constraints": true,
                                 "planning": false, "confirmation": true}}}),
            meta,
        )],
        "arp.callTool" => {
            books.count("arp.robot_received");
            let key = frame["params"]["idempotencyKey"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let full_key = format!("{subject}|{key}");
            if let Some(answer) = remembered.get(&full_key) {
                books.count("arp.robot_replayed_from_key");
                let mut answer = answer.clone();
                answer["id"] = id;
                return vec![reply(answer, meta)];
            }
            if frame["params"]["name"] == "navigate_to" {
                // Ask the program (policy client) before running.
                let request = format!("confirm-{}", uuid::Uuid::new_v4().simple());
                asked.insert(request.clone(), (subject.clone(), id, full_key));
                let mut ask = reply(
                    json!({"jsonrpc": "2.0", "id": request, "method": "arp.requestConfirmation",
                           "params": {"action": "navigate_to", "safetyLevel": "medium",
                                      "details": {"tool": "navigate_to", "arguments": frame["params"]["arguments"]},
                                      "timeout": 10}}),
                    None,
                );
                let mut meta = meta.unwrap_or_else(|| json!({}));
                meta["confirmationPolicy"] = json!("client");
                ask["meta"] = meta;
                books.count("arp.confirmations_asked");
                return vec![ask];
            }
            let answer = run_call(books, &subject, &full_key, &id, remembered);
            vec![reply(answer, meta)]
        }
        _ => vec![reply(
            json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            meta,
        )],
    }
}

/// Runs a call: counted once per key in the books, remembered for retries.
fn run_call(
    books: &super::Books,
    _subject: &str,
    full_key: &str,
    id: &Value,
    remembered: &mut HashMap<String, Value>,
) -> Value {
    if let Some(answer) = remembered.get(full_key) {
        books.count("arp.robot_replayed_from_key");
        let mut answer = answer.clone();
        answer["id"] = id.clone();
        return answer;
    }
    books.executed(full_key);
    books.count("arp.robot_executed");
    let answer = json!({"jsonrpc": "2.0", "id": id, "result": {
        "callId": format!("c-{}", uuid::Uuid::new_v4().simple()), "state": "completed", "result": {}}});
    if remembered.len() > 4096 {
        remembered.clear();
    }
    remembered.insert(full_key.to_string(), answer.clone());
    answer
}

/// robot-agent's answer to a ticket's key exchange: a fresh X25519 public key.
fn key_exchange(message: &Value) -> Option<String> {
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
