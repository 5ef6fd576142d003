//! People: an operator per driven robot relaying at 15 Hz, and viewers watching driven
//! robots. Each keeps one session open, opens it again when it ends (with backoff), and
//! checks that what it receives is for its own session.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::{envelope, frame_tag, heard, parse_tag, Backoff, Heard, Shared};
use crate::target::{self, Reads};

/// Frames per second an operator sends.
const OPERATOR_HZ: u64 = 15;

/// Runs one person until the run stops: `operator` drives `robot_id`, else watches it.
pub async fn run(shared: Arc<Shared>, robot_id: String, operator: bool) {
    let books = &shared.books;
    let who = if operator { "operator" } else { "viewer" };
    let token = if operator {
        shared.operator_token.clone()
    } else {
        shared.viewer_token.clone()
    };
    let mut backoff = Backoff::new();
    while !shared.stopping() {
        let url = format!("{}?token={token}", shared.ws_url);
        let socket =
            match tokio::time::timeout(Duration::from_secs(5), target::connect(&url, Reads::Relay))
                .await
            {
                Ok(Ok(socket)) => socket,
                _ => {
                    books.count(&format!("{who}.connect_failed"));
                    backoff.wait(&shared).await;
                    continue;
                }
            };
        books.count(&format!("{who}.connects"));
        let outcome = sessions_on(&shared, socket, &robot_id, operator, &mut backoff).await;
        books.count(&format!("{who}.socket_ended.{outcome}"));
        if !shared.stopping() {
            backoff.wait(&shared).await;
        }
    }
}

type Sink = SplitSink<target::Socket, Message>;

/// What a person does after a message or a tick.
enum Flow {
    /// Goes on in the same session.
    Stay,
    /// Opens the next session.
    NextSession,
    /// The socket is done with, and how.
    End(&'static str),
}

/// Opens sessions on one socket, one at a time, until the socket ends.
async fn sessions_on(
    shared: &Shared,
    socket: target::Socket,
    robot_id: &str,
    operator: bool,
    backoff: &mut Backoff,
) -> &'static str {
    let (mut sink, mut stream) = socket.split();
    let mut stop = shared.stop_signal();
    let mut person = Person::new(shared, robot_id, operator, backoff);
    loop {
        let offer = person.next_offer();
        if sink.send(Message::text(offer.to_string())).await.is_err() {
            return "send_failed";
        }
        person.offered();
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / OPERATOR_HZ));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        person.churn_at = shared.churn_deadline();
        loop {
            let flow = tokio::select! {
                _ = stop.changed() => {
                    person.hang_up(&mut sink).await;
                    return "stopped";
                }
                _ = tick.tick() => person.on_tick(&mut sink).await,
                frame = stream.next() => match heard(&shared.books, frame, "client_got_bad_json") {
                    Heard::Json(message) => person.on_message(&message).await,
                    Heard::Nothing => Flow::Stay,
                    Heard::Ended(how) => Flow::End(how),
                },
            };
            match flow {
                Flow::Stay => {}
                Flow::NextSession => break,
                Flow::End(how) => return how,
            }
        }
    }
}

/// An operator or a viewer on one socket, and the session it has open (or offered).
struct Person<'a> {
    shared: &'a Shared,
    robot_id: &'a str,
    operator: bool,
    who: &'static str,
    backoff: &'a mut Backoff,
    /// The socket's clock, for the frames' stamps.
    started: Instant,
    /// Sessions this socket opened before: a late answer for one of them is its own.
    earlier: HashSet<String>,
    /// The session's id.
    session: String,
    /// The id of its offer: an error correlated with it refuses the session.
    offer_id: Value,
    answered: bool,
    offered_at: Instant,
    seq: u64,
    churn_at: Option<Instant>,
}

impl<'a> Person<'a> {
    fn new(
        shared: &'a Shared,
        robot_id: &'a str,
        operator: bool,
        backoff: &'a mut Backoff,
    ) -> Self {
        Person {
            shared,
            robot_id,
            operator,
            who: if operator { "operator" } else { "viewer" },
            backoff,
            started: Instant::now(),
            earlier: HashSet::new(),
            session: String::new(),
            offer_id: Value::Null,
            answered: false,
            offered_at: Instant::now(),
            seq: 0,
            churn_at: None,
        }
    }

    /// The offer of a new session (the one before becomes an earlier one).
    fn next_offer(&mut self) -> Value {
        if !self.session.is_empty() {
            self.earlier.insert(std::mem::take(&mut self.session));
        }
        self.session = format!("chaos-{}", uuid::Uuid::new_v4().simple());
        let offer = envelope(
            "signalling.offer",
            json!({"robotId": self.robot_id, "connectionId": self.session, "sdpType": "offer", "sdp": "v=0\r\n"}),
        );
        self.offer_id = offer["id"].clone();
        offer
    }

    /// The offer is sent: the session waits for its answer.
    fn offered(&mut self) {
        self.shared
            .books
            .count(&format!("{}.offers_sent", self.who));
        self.answered = false;
        self.offered_at = Instant::now();
        self.seq = 0;
    }

    fn bye(&self) -> Message {
        let bye = envelope(
            "signalling.disconnected",
            json!({"connectionId": self.session, "reason": "closed"}),
        );
        Message::text(bye.to_string())
    }

    /// The run stops: ends the session, if open, and closes the socket.
    async fn hang_up(&self, sink: &mut Sink) {
        if self.answered {
            let _ = sink.send(self.bye()).await;
            self.shared
                .books
                .count(&format!("{}.sessions_hung_up", self.who));
        }
        let _ = sink.close().await;
    }

    /// Gives up an unanswered offer, churns the session when due, or sends the operator's
    /// next frame.
    async fn on_tick(&mut self, sink: &mut Sink) -> Flow {
        let books = &self.shared.books;
        let who = self.who;
        if !self.answered {
            if self.offered_at.elapsed() > Duration::from_secs(10) {
                books.count(&format!("{who}.offers_unanswered"));
                books.error("signalling:offer_unanswered_10s");
                return Flow::End("offer_unanswered");
            }
            return Flow::Stay;
        }
        if self.churn_at.is_some_and(|at| Instant::now() >= at) {
            if sink.send(self.bye()).await.is_err() {
                return Flow::End("send_failed");
            }
            books.count(&format!("{who}.sessions_churned"));
            return Flow::NextSession;
        }
        if self.operator {
            self.seq += 1;
            let stamp = self.started.elapsed().as_nanos() as u64 + 1;
            let text = envelope(
                "signalling.ice_candidate",
                json!({"connectionId": self.session, "candidate": format!("candidate:1 1 UDP 1 127.0.0.1 9 typ host {}", frame_tag(&self.session, self.seq, stamp)), "sdpMid": "0", "sdpMLineIndex": 0}),
            ).to_string();
            if sink.send(Message::text(text)).await.is_err() {
                return Flow::End("send_failed");
            }
            books.count("frames.operator_sent");
        }
        Flow::Stay
    }

    async fn on_message(&mut self, message: &Value) -> Flow {
        let payload = &message["payload"];
        let named = payload["connectionId"].as_str().unwrap_or("");
        match message["type"].as_str().unwrap_or("") {
            "signalling.answer" => self.on_answer(named),
            "signalling.ice_candidate" => {
                self.on_frame(named, payload["candidate"].as_str().unwrap_or(""))
            }
            "signalling.disconnected" if named == self.session => {
                let reason = payload["details"]["reason"]
                    .as_str()
                    .or(payload["reason"].as_str())
                    .unwrap_or("");
                let books = &self.shared.books;
                if reason.is_empty() {
                    books.breach("session_ended_without_a_reason", message.to_string());
                }
                books.count(&format!("{}.sessions_ended.{reason}", self.who));
                self.backoff.wait(self.shared).await;
                return Flow::NextSession;
            }
            "signalling.error" => return self.on_error(message).await,
            _ => {}
        }
        Flow::Stay
    }

    fn on_answer(&mut self, named: &str) {
        let books = &self.shared.books;
        if named != self.session && self.earlier.contains(named) {
            books.count("answers.late_from_an_earlier_session");
            return;
        }
        if named != self.session {
            books.breach(
                "frame_to_a_non_party",
                format!("{} {} got an answer for {named}", self.who, self.session),
            );
            return;
        }
        self.answered = true;
        self.backoff.reset();
        books.count(&format!("{}.sessions_opened", self.who));
    }

    /// A frame: the session's own (its round trip measured), an earlier session's, late,
    /// or a breach.
    fn on_frame(&self, named: &str, candidate: &str) {
        let books = &self.shared.books;
        let (who, session) = (self.who, self.session.as_str());
        match parse_tag(candidate) {
            Some((tagged, _, stamp)) if tagged == session && named == session => {
                books.count(&format!("frames.{who}_received"));
                if stamp > 0 {
                    let now = self.started.elapsed().as_nanos() as u64 + 1;
                    books.relay_rtt.record(now.saturating_sub(stamp));
                }
            }
            Some((tagged, _, _))
                if tagged != session
                    && named != session
                    && !named.is_empty()
                    && tagged == named =>
            {
                // A frame of an earlier session of this socket, arriving late.
                books.count("frames.late_from_an_earlier_session");
            }
            _ => books.breach(
                "frame_to_a_non_party",
                format!("{who} in {session} got {named}: {candidate}"),
            ),
        }
    }

    async fn on_error(&mut self, message: &Value) -> Flow {
        let books = &self.shared.books;
        let payload = &message["payload"];
        let code = payload["code"].as_str().unwrap_or("");
        let reason = payload["details"]["reason"].as_str().unwrap_or("");
        if code.is_empty() {
            books.breach("error_without_a_code", message.to_string());
        }
        books.error(&format!("signalling:{code}/{reason}"));
        // Only an error about this offer refuses it (others are about frames of an
        // earlier session, sent before its end was heard).
        if !self.answered && message["correlationId"] == self.offer_id {
            books.count(&format!("{}.offers_refused", self.who));
            self.backoff.wait(self.shared).await;
            return Flow::NextSession;
        }
        Flow::Stay
    }
}
