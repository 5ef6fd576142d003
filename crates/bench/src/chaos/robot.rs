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
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::{envelope, frame_tag, heard, parse_tag, Backoff, Heard, Shared};
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
    let register = target::register_message(robot_id, json!({"arp": "0.1.0"}));
    socket.send(Message::text(register.to_string())).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let message = target::next_json_by(&mut socket, deadline).await?;
        match message["type"].as_str() {
            Some("signalling.pki_challenge") => {
                let response = target::pki_response(&message, signer)?;
                socket.send(Message::text(response.to_string())).await?;
            }
            Some("signalling.welcome") if message["payload"].get("iceServers").is_some() => {
                // The first welcome comes before the proof; the second after pki_verified.
            }
            Some("signalling.pki_verified") => {
                // Wait for the second welcome below.
                let next = target::next_json_by(&mut socket, deadline).await?;
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
    let mut robot = Connection::new(shared, robot_id, remembered);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = shared.stop_signal();
    loop {
        let out = tokio::select! {
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
                for text in robot.own_frames() {
                    if sink.send(Message::text(text)).await.is_err() {
                        return "send_failed";
                    }
                    books.count("frames.robot_sent");
                }
                continue;
            }
            frame = stream.next() => match heard(books, frame, "robot_got_bad_json") {
                Heard::Json(message) => robot.answer(&message),
                Heard::Nothing => continue,
                Heard::Ended(how) => return how,
            },
        };
        for text in out {
            if sink.send(Message::text(text)).await.is_err() {
                return "send_failed";
            }
        }
    }
}

/// One login of the robot: its sessions, what it heard, the confirmations it asked for.
struct Connection<'a> {
    shared: &'a Shared,
    robot_id: &'a str,
    sessions: HashMap<String, Session>,
    /// Sessions that ended: frames for them may still arrive late, harmlessly.
    ended: HashSet<String>,
    /// The last session events, shown with a breach: what the robot heard, in its order.
    seen: Seen,
    /// Confirmations asked: request id → the call waiting for it.
    asked: HashMap<String, Asked>,
    /// Idempotency keys this robot has run, over its logins: (subject|key) → its answer.
    remembered: &'a mut HashMap<String, Value>,
}

/// A message to the robot, with what it reads from every kind.
#[derive(Clone, Copy)]
struct Incoming<'m> {
    message: &'m Value,
    session_id: &'m str,
    role: &'m str,
    /// The session's role drives the robot.
    controls: bool,
}

/// A call waiting for the confirmation the robot asked the program for.
struct Asked {
    subject: String,
    call_id: Value,
    /// subject|idempotency key.
    key: String,
}

impl<'a> Connection<'a> {
    fn new(
        shared: &'a Shared,
        robot_id: &'a str,
        remembered: &'a mut HashMap<String, Value>,
    ) -> Self {
        Connection {
            shared,
            robot_id,
            sessions: HashMap::new(),
            ended: HashSet::new(),
            seen: Seen::default(),
            asked: HashMap::new(),
            remembered,
        }
    }

    /// The next frame of its own for every teleop session.
    fn own_frames(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (id, session) in self.sessions.iter_mut().filter(|(_, s)| s.teleop) {
            session.seq += 1;
            out.push(ice(id, &frame_tag(id, session.seq, 0)));
        }
        out
    }

    /// What the robot sends in answer to one message.
    fn answer(&mut self, message: &Value) -> Vec<String> {
        let payload = &message["payload"];
        let session_id = payload["connectionId"].as_str().unwrap_or("");
        let role = message["meta"]["session"]["role"].as_str().unwrap_or("");
        let incoming = Incoming {
            message,
            session_id,
            role,
            controls: matches!(role, "operator" | "owner"),
        };
        match message["type"].as_str().unwrap_or("") {
            "signalling.offer" => self.on_offer(&incoming),
            "signalling.ice_candidate" => {
                let candidate = payload["candidate"].as_str().unwrap_or("");
                self.on_frame(session_id, candidate).into_iter().collect()
            }
            "signalling.disconnected" => {
                let reason = payload["details"]["reason"].as_str().unwrap_or("");
                self.seen
                    .note(format!("disconnected {session_id} {reason}"));
                if self.sessions.remove(session_id).is_some() {
                    self.shared.books.count("sessions.robot_told_end");
                }
                self.ended.insert(session_id.to_string());
                Vec::new()
            }
            "arp.frame" => self.on_arp_frame(&incoming),
            "signalling.error" => {
                let code = payload["code"].as_str().unwrap_or("?");
                let reason = payload["details"]["reason"].as_str().unwrap_or("");
                self.shared.books.error(&format!("robot:{code}/{reason}"));
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn on_offer(&mut self, incoming: &Incoming) -> Vec<String> {
        let session_id = incoming.session_id;
        let books = &self.shared.books;
        books.count("offers.robot_received");
        let robot_id = self.robot_id;
        if incoming.message["payload"]["robotId"]
            .as_str()
            .is_some_and(|r| r != robot_id)
        {
            books.breach(
                "offer_for_another_robot",
                format!("{robot_id}: {}", incoming.message),
            );
        }
        self.seen
            .note(format!("offer {session_id} {}", incoming.role));
        self.open_session(session_id, incoming.controls, true);
        let answer = envelope(
            "signalling.answer",
            json!({"connectionId": session_id, "sdpType": "answer", "sdp": "v=0\r\n"}),
        );
        vec![answer.to_string()]
    }

    /// A client's frame: echoed when it is of a session of this robot's, else a breach.
    fn on_frame(&mut self, session_id: &str, candidate: &str) -> Option<String> {
        let books = &self.shared.books;
        let robot_id = self.robot_id;
        if !self.sessions.contains_key(session_id) {
            if !self.ended.contains(session_id) {
                books.breach(
                    "frame_to_a_non_party",
                    format!("robot {robot_id} got a frame of {session_id}"),
                );
            }
            return None;
        }
        match parse_tag(candidate) {
            Some((tagged, seq, stamp)) if tagged == session_id => {
                books.count("frames.robot_received");
                // Echo the client's stamp: its round trip is the relay's.
                Some(ice(session_id, &frame_tag(session_id, seq, stamp)))
            }
            _ => {
                books.breach(
                    "frame_to_a_non_party",
                    format!("robot {robot_id}, session {session_id}: {candidate}"),
                );
                None
            }
        }
    }

    /// An ARP frame: opens the session if it is new, then answers.
    fn on_arp_frame(&mut self, incoming: &Incoming) -> Vec<String> {
        let session_id = incoming.session_id;
        if !self.sessions.contains_key(session_id) {
            if self.ended.contains(session_id) {
                self.shared.books.count("arp.robot_frame_after_end");
                return Vec::new();
            }
            self.seen
                .note(format!("arp.frame(new) {session_id} {}", incoming.role));
            self.open_session(session_id, incoming.controls, false);
        }
        self.arp_answer(incoming.message)
            .map(|frame| frame.to_string())
            .into_iter()
            .collect()
    }

    fn open_session(&mut self, id: &str, controls: bool, teleop: bool) {
        let books = &self.shared.books;
        self.sessions.insert(
            id.to_string(),
            Session {
                controls,
                teleop,
                seq: 0,
            },
        );
        let controllers = self.sessions.values().filter(|s| s.controls).count() as u64;
        books.controllers_seen(controllers);
        if controllers > 1 {
            let ids: Vec<&String> = self
                .sessions
                .iter()
                .filter(|(_, s)| s.controls)
                .map(|(id, _)| id)
                .collect();
            books.breach(
                "two_controllers_of_one_robot",
                format!("{ids:?}; heard: {:?}", self.seen.events),
            );
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

fn ice(session: &str, tag: &str) -> String {
    envelope(
        "signalling.ice_candidate",
        json!({"connectionId": session, "candidate": format!("candidate:1 1 UDP 1 127.0.0.1 9 typ host {tag}"), "sdpMid": "0", "sdpMLineIndex": 0}),
    )
    .to_string()
}

impl Connection<'_> {
    /// The robot's frame in answer to one `arp.frame`, if any.
    fn arp_answer(&mut self, message: &Value) -> Option<Value> {
        let connection = &message["payload"]["connectionId"];
        let frame = &message["payload"]["frame"];
        if frame.get("method").is_none() {
            return self.on_confirmation(connection, frame);
        }
        let id = frame.get("id").cloned()?;
        let meta =
            crate::target::key_exchange_answer(message).map(|half| json!({"ticketKey": half}));
        Some(match frame["method"].as_str().unwrap_or("") {
            "arp.initialize" => arp_reply(
                connection,
                json!({"jsonrpc": "2.0", "id": id, "result": {
                    "protocolVersion": "0.1.0",
                    "serverInfo": {"name": "chaos-robot", "version": "1"},
                    "capabilities": {"tools": true, "context": true, "constraints": true,
                                     "planning": false, "confirmation": true}}}),
                meta,
            ),
            "arp.callTool" => {
                let subject = message["meta"]["session"]["subject"].as_str().unwrap_or("");
                self.call_tool(connection, frame, subject, id, meta)
            }
            _ => arp_reply(
                connection,
                json!({"jsonrpc": "2.0", "id": id, "result": {}}),
                meta,
            ),
        })
    }

    /// An answer to a confirmation this robot asked for: the call runs if it was given.
    fn on_confirmation(&mut self, connection: &Value, frame: &Value) -> Option<Value> {
        let books = &self.shared.books;
        let request = frame["id"].as_str()?;
        let Some(asked) = self.asked.remove(request) else {
            books.breach(
                "robot_got_an_unsolicited_answer",
                format!("{}: {frame}", self.robot_id),
            );
            return None;
        };
        if frame["result"]["confirmed"] != true {
            books.count("arp.confirmations_denied");
            return Some(arp_reply(
                connection,
                json!({"jsonrpc": "2.0", "id": asked.call_id, "error": {"code": -40006, "message": "confirmation denied"}}),
                None,
            ));
        }
        books.count("arp.confirmations_given");
        let confirmed_by = frame["result"]["confirmedBy"].as_str().unwrap_or("");
        if !confirmed_by.ends_with(" via client") || !confirmed_by.starts_with(&asked.subject) {
            books.breach(
                "confirmation_by_someone_else",
                format!("{}: {confirmed_by}", self.robot_id),
            );
        }
        let answer = run_call(books, &asked.key, &asked.call_id, self.remembered);
        Some(arp_reply(connection, answer, None))
    }

    /// A tool call: answered from its key if it ran, else run, or first confirmed
    /// (`navigate_to`: the robot asks the program, the policy client, before running it).
    fn call_tool(
        &mut self,
        connection: &Value,
        frame: &Value,
        subject: &str,
        id: Value,
        meta: Option<Value>,
    ) -> Value {
        let books = &self.shared.books;
        books.count("arp.robot_received");
        let key = frame["params"]["idempotencyKey"].as_str().unwrap_or("");
        let full_key = format!("{subject}|{key}");
        if let Some(answer) = replayed(books, self.remembered, &full_key, &id) {
            return arp_reply(connection, answer, meta);
        }
        if frame["params"]["name"] != "navigate_to" {
            let answer = run_call(books, &full_key, &id, self.remembered);
            return arp_reply(connection, answer, meta);
        }
        let request = format!("confirm-{}", uuid::Uuid::new_v4().simple());
        let asked = Asked {
            subject: subject.to_string(),
            call_id: id,
            key: full_key,
        };
        self.asked.insert(request.clone(), asked);
        let mut ask = arp_reply(
            connection,
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
        ask
    }
}

/// An `arp.frame` to the client of `connection`, with `meta` if any.
fn arp_reply(connection: &Value, frame: Value, meta: Option<Value>) -> Value {
    let mut answer = envelope(
        "arp.frame",
        json!({"connectionId": connection, "frame": frame}),
    );
    if let Some(meta) = meta {
        answer["meta"] = meta;
    }
    answer
}

/// The answer a call with this key got, again (for the call `id`), if it ran before.
fn replayed(
    books: &super::Books,
    remembered: &HashMap<String, Value>,
    full_key: &str,
    id: &Value,
) -> Option<Value> {
    let mut answer = remembered.get(full_key)?.clone();
    books.count("arp.robot_replayed_from_key");
    answer["id"] = id.clone();
    Some(answer)
}

/// Runs a call: counted once per key in the books, remembered for retries.
fn run_call(
    books: &super::Books,
    full_key: &str,
    id: &Value,
    remembered: &mut HashMap<String, Value>,
) -> Value {
    if let Some(answer) = replayed(books, remembered, full_key, id) {
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
