//! People: an operator per driven robot relaying at 15 Hz, and viewers watching driven
//! robots. Each keeps one session open, opens it again when it ends (with backoff), and
//! checks that what it receives is for its own session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::{envelope, frame_tag, parse_tag, Backoff, Shared};
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

/// Opens sessions on one socket, one at a time, until the socket ends.
async fn sessions_on(
    shared: &Shared,
    socket: target::Socket,
    robot_id: &str,
    operator: bool,
    backoff: &mut Backoff,
) -> &'static str {
    let books = &shared.books;
    let who = if operator { "operator" } else { "viewer" };
    let (mut sink, mut stream) = socket.split();
    let mut stop = shared.stop_signal();
    let started = Instant::now();
    // Sessions this socket opened before: a late answer for one of them is its own.
    let mut earlier: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut session = String::new();
    'session: loop {
        if !session.is_empty() {
            earlier.insert(std::mem::take(&mut session));
        }
        session = format!("chaos-{}", uuid::Uuid::new_v4().simple());
        let offer = envelope(
            "signalling.offer",
            json!({"robotId": robot_id, "connectionId": session, "sdpType": "offer", "sdp": "v=0\r\n"}),
        );
        let offer_id = offer["id"].clone();
        if sink.send(Message::text(offer.to_string())).await.is_err() {
            return "send_failed";
        }
        books.count(&format!("{who}.offers_sent"));
        let mut answered = false;
        let offered_at = Instant::now();
        let mut seq = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / OPERATOR_HZ));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let churn_at = shared.churn_deadline();
        loop {
            let message = tokio::select! {
                _ = stop.changed() => {
                    if answered {
                        let bye = envelope("signalling.disconnected", json!({"connectionId": session, "reason": "closed"}));
                        let _ = sink.send(Message::text(bye.to_string())).await;
                        books.count(&format!("{who}.sessions_hung_up"));
                    }
                    let _ = sink.close().await;
                    return "stopped";
                }
                _ = tick.tick() => {
                    if !answered {
                        if offered_at.elapsed() > Duration::from_secs(10) {
                            books.count(&format!("{who}.offers_unanswered"));
                            books.error("signalling:offer_unanswered_10s");
                            return "offer_unanswered";
                        }
                        continue;
                    }
                    if churn_at.is_some_and(|at| Instant::now() >= at) {
                        let bye = envelope("signalling.disconnected", json!({"connectionId": session, "reason": "closed"}));
                        if sink.send(Message::text(bye.to_string())).await.is_err() {
                            return "send_failed";
                        }
                        books.count(&format!("{who}.sessions_churned"));
                        continue 'session;
                    }
                    if operator {
                        seq += 1;
                        let stamp = started.elapsed().as_nanos() as u64 + 1;
                        let text = envelope(
                            "signalling.ice_candidate",
                            json!({"connectionId": session, "candidate": format!("candidate:1 1 UDP 1 127.0.0.1 9 typ host {}", frame_tag(&session, seq, stamp)), "sdpMid": "0", "sdpMLineIndex": 0}),
                        ).to_string();
                        if sink.send(Message::text(text)).await.is_err() {
                            return "send_failed";
                        }
                        books.count("frames.operator_sent");
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
                books.breach("client_got_bad_json", text.chars().take(200).collect());
                continue;
            };
            let payload = &message["payload"];
            let named = payload["connectionId"].as_str().unwrap_or("");
            match message["type"].as_str().unwrap_or("") {
                "signalling.answer" => {
                    if named != session && earlier.contains(named) {
                        books.count("answers.late_from_an_earlier_session");
                        continue;
                    }
                    if named != session {
                        books.breach(
                            "frame_to_a_non_party",
                            format!("{who} {session} got an answer for {named}"),
                        );
                        continue;
                    }
                    answered = true;
                    backoff.reset();
                    books.count(&format!("{who}.sessions_opened"));
                }
                "signalling.ice_candidate" => {
                    let candidate = payload["candidate"].as_str().unwrap_or("");
                    match parse_tag(candidate) {
                        Some((tagged, _, stamp)) if tagged == session && named == session => {
                            books.count(&format!("frames.{who}_received"));
                            if stamp > 0 {
                                let now = started.elapsed().as_nanos() as u64 + 1;
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
                "signalling.disconnected" => {
                    if named != session {
                        continue;
                    }
                    let reason = payload["details"]["reason"]
                        .as_str()
                        .or(payload["reason"].as_str())
                        .unwrap_or("");
                    if reason.is_empty() {
                        books.breach("session_ended_without_a_reason", message.to_string());
                    }
                    books.count(&format!("{who}.sessions_ended.{reason}"));
                    backoff.wait(shared).await;
                    continue 'session;
                }
                "signalling.error" => {
                    let code = payload["code"].as_str().unwrap_or("");
                    let reason = payload["details"]["reason"].as_str().unwrap_or("");
                    if code.is_empty() {
                        books.breach("error_without_a_code", message.to_string());
                    }
                    books.error(&format!("signalling:{code}/{reason}"));
                    // Only an error about this offer refuses it (others are about frames of
                    // an earlier session, sent before its end was heard).
                    if !answered && message["correlationId"] == offer_id {
                        books.count(&format!("{who}.offers_refused"));
                        backoff.wait(shared).await;
                        continue 'session;
                    }
                }
                _ => {}
            }
        }
    }
}
