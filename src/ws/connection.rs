//! One socket's task: reads frames, writes queued messages, pings, enforces limits and
//! deadlines, and cleans up after itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use tokio::time::{interval_at, sleep_until, MissedTickBehavior};

use super::error::WsError;
use super::protocol::{Peer, Protocol};
use super::rate_limit::RateLimiter;
use crate::auth::ClientIdentity;
use crate::messages;
use crate::relay::{ConnId, Kick, Mailbox, Outbound};
use crate::state::SharedState;

type Sink = SplitSink<WebSocket, Message>;

pub async fn run(state: SharedState, socket: WebSocket, client: Option<ClientIdentity>) {
    let _guard = state.socket_guard();
    let conn: ConnId = Arc::from(uuid::Uuid::new_v4().to_string());
    let (mailbox, mut inbox) = Mailbox::new(state.config.send_queue);
    state.hub.attach(conn.clone(), mailbox);
    if let Some(identity) = &client {
        state.hub.set_client(&conn, identity.token_id.clone());
        tracing::debug!(conn = %conn, subject = %identity.subject, "client connected");
    }
    let mut protocol = Protocol::new(state.clone(), conn.clone(), client);
    let mut role = protocol.role_label();
    state.metrics.connections.with_label_values(&[role]).inc();

    let (mut sink, mut stream) = socket.split();
    let config = &state.config;
    let login_deadline = Instant::now() + Duration::from_secs(config.login_timeout_secs);
    let ping_every = Duration::from_secs(config.ping_interval_secs.max(1));
    let idle_timeout = Duration::from_secs(config.idle_timeout_secs.max(1));
    let mut ping = interval_at(tokio::time::Instant::now() + ping_every, ping_every);
    ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut limiter = RateLimiter::new(config.rate_limit, config.rate_burst, Instant::now());
    let mut over_limit = 0u32;
    let mut last_heard = Instant::now();

    let welcome = protocol.welcome();
    let mut open = sink.send(Message::Text(welcome.into())).await.is_ok();

    // Futures that live across loop turns are made once: building a timer entry or a watch
    // notification per message showed up in relay profiles.
    let mut deadline = protocol.deadline(login_deadline);
    let timer = sleep_until(timer_instant(&deadline));
    tokio::pin!(timer);
    let mut kick_watch = inbox.kick.clone();
    let kicked = kick_watch.changed();
    tokio::pin!(kicked);

    while open {
        tokio::select! {
            biased;
            outbound = inbox.queue.recv() => match outbound {
                Some(Outbound::Text(text)) => {
                    open = sink.send(Message::Text(text.into())).await.is_ok();
                }
                None => open = false,
            },
            _ = &mut kicked => {
                let kick = *inbox.kick.borrow();
                if let Some(kick) = kick {
                    // Deliver what was queued before the kick (e.g. disconnect notices).
                    while let Ok(Outbound::Text(text)) = inbox.queue.try_recv() {
                        if sink.send(Message::Text(text.into())).await.is_err() {
                            break;
                        }
                    }
                    if kick == Kick::Revoked {
                        let error = WsError::Identity(crate::identity::IdentityError::Revoked);
                        send_error(&state, &mut sink, &error, None).await;
                    }
                    let (code, reason) = kick.close_frame();
                    close(&mut sink, code, reason).await;
                }
                open = false;
            }
            frame = stream.next() => match frame {
                None | Some(Ok(Message::Close(_))) => open = false,
                Some(Err(e)) => {
                    if is_too_large(&e) {
                        reject_too_large(&state, &mut sink).await;
                    } else {
                        tracing::debug!(conn = %conn, error = %e, "socket read failed");
                    }
                    open = false;
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => last_heard = Instant::now(),
                Some(Ok(Message::Binary(bytes))) if bytes.len() > config.max_frame_bytes => {
                    reject_too_large(&state, &mut sink).await;
                    open = false;
                }
                Some(Ok(Message::Binary(_))) => {
                    last_heard = Instant::now();
                    send_error(&state, &mut sink, &WsError::Binary, None).await;
                }
                Some(Ok(Message::Text(text))) if text.len() > config.max_frame_bytes => {
                    reject_too_large(&state, &mut sink).await;
                    open = false;
                }
                Some(Ok(Message::Text(text))) => {
                    let received = Instant::now();
                    last_heard = received;
                    if !limiter.allow(received) {
                        over_limit += 1;
                        let error = if over_limit > config.rate_burst { WsError::Flooding } else { WsError::RateLimited };
                        send_error(&state, &mut sink, &error, None).await;
                        if let Some((code, reason)) = error.close() {
                            close(&mut sink, code, reason).await;
                            open = false;
                        }
                        continue;
                    }
                    over_limit = 0;
                    let result = protocol.handle(text.as_str(), received).await;
                    for reply in protocol.replies.drain(..) {
                        if sink.send(Message::Text(reply.into())).await.is_err() {
                            open = false;
                        }
                    }
                    if let Err((error, id)) = result {
                        if matches!(error.code(), signalling_protocol::ErrorCode::InternalError) {
                            tracing::error!(conn = %conn, error = %error, "message failed");
                        }
                        send_error(&state, &mut sink, &error, id.as_deref()).await;
                        if let Some((code, reason)) = error.close() {
                            close(&mut sink, code, reason).await;
                            open = false;
                        }
                    }
                    let next = protocol.deadline(login_deadline);
                    if next.as_ref().map(|(at, _)| *at) != deadline.as_ref().map(|(at, _)| *at) {
                        timer.as_mut().reset(timer_instant(&next));
                    }
                    deadline = next;
                    let now_role = protocol.role_label();
                    if now_role != role {
                        state.metrics.connections.with_label_values(&[role]).dec();
                        state.metrics.connections.with_label_values(&[now_role]).inc();
                        role = now_role;
                    }
                }
            },
            _ = ping.tick() => {
                if last_heard.elapsed() > idle_timeout {
                    tracing::debug!(conn = %conn, "dropping dead connection");
                    open = false;
                } else {
                    open = sink.send(Message::Ping(Vec::new().into())).await.is_ok();
                }
            }
            _ = &mut timer, if deadline.is_some() => {
                if let Some((_, error)) = deadline.take() {
                    send_error(&state, &mut sink, &error, None).await;
                    let (code, reason) = error.close().unwrap_or((1008, "deadline"));
                    close(&mut sink, code, reason).await;
                }
                open = false;
            }
        }
    }

    state.metrics.connections.with_label_values(&[role]).dec();
    state.sessions.detach(&conn).await;
    if let Peer::Robot { robot_id } = &protocol.peer {
        tracing::info!(robot = %robot_id, conn = %conn, "robot disconnected");
    }
}

/// When the deadline timer fires; far in the future when there is no deadline (the branch
/// is disabled then anyway).
fn timer_instant(deadline: &Option<(Instant, WsError)>) -> tokio::time::Instant {
    match deadline {
        Some((at, _)) => tokio::time::Instant::from_std(*at),
        None => tokio::time::Instant::now() + Duration::from_secs(86_400 * 365),
    }
}

async fn send_error(
    state: &SharedState,
    sink: &mut Sink,
    error: &WsError,
    correlation: Option<&str>,
) {
    let code = error.code();
    state
        .metrics
        .errors
        .with_label_values(&[code.as_str()])
        .inc();
    let text = messages::error(code, &error.to_string(), error.details(), correlation);
    let _ = sink.send(Message::Text(text.into())).await;
}

async fn reject_too_large(state: &SharedState, sink: &mut Sink) {
    let error = WsError::TooLarge {
        limit: state.config.max_frame_bytes,
    };
    send_error(state, sink, &error, None).await;
    let (code, reason) = error.close().unwrap_or((1009, "frame too large"));
    close(sink, code, reason).await;
}

async fn close(sink: &mut Sink, code: u16, reason: &'static str) {
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
    let _ = sink.close().await;
}

fn is_too_large(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(tungstenite::Error::Capacity(_)) = e.downcast_ref::<tungstenite::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}
