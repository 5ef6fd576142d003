//! One socket, as two tasks: this one reads frames, enforces limits, deadlines and kicks;
//! a writer task sends queued frames. Nothing here awaits a send, so a peer that never
//! reads cannot hold back its own login deadline, idle timeout or kick, and a writer that
//! makes no progress for the write timeout gives up on the socket.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::oneshot;
use tokio::time::sleep_until;
use tracing::Instrument;

use super::error::WsError;
use super::legacy;
use super::protocol::{Peer, Protocol};
use crate::admission::Permit;
use crate::auth::ClientIdentity;
use crate::config::Config;
use crate::messages;
use crate::rate_limit::{RateLimiter, Strikes};
use crate::relay::{ConnId, DeliveryError, Kick, KickReceiver, Mailbox, Outbound, QueueReceiver};
use crate::state::SharedState;

type Sink = SplitSink<WebSocket, Message>;

/// Window over which strikes (errors earned, messages over the rate limit) are counted.
const STRIKE_WINDOW: Duration = Duration::from_secs(10);

/// How long a socket the server closes waits for the peer's close frame.
const CLOSE_HANDSHAKE: Duration = Duration::from_secs(2);

/// Frames the writer sends before one flush.
const WRITE_BATCH: usize = 64;

/// A close the reader asks of the writer: code and reason.
type CloseRequest = (u16, &'static str);

/// Starts the socket's tasks. Called from axum's upgrade task, which ends right after:
/// that wrapper keeps its captures for as long as the future it runs, a few hundred bytes
/// in every socket, so the socket task is spawned on its own.
pub fn start(
    state: SharedState,
    socket: WebSocket,
    client: Option<ClientIdentity>,
    cuts_seen: u64,
    permit: Permit,
) {
    let conn: ConnId = Arc::from(uuid::Uuid::new_v4().to_string());
    // Every line logged for this socket, here and below, carries its id.
    let span = tracing::info_span!("ws", conn = %conn);
    let task = span.in_scope(|| serve(state, socket, client, cuts_seen, conn, permit));
    tokio::spawn(task.instrument(span));
}

/// A token revocation came between this client's token check and its registration, and may
/// have missed the socket: check the token again (on its own task, so the socket's stays
/// small) and close the socket if it was withdrawn. Fails closed.
fn recheck_token(state: &SharedState, conn: &ConnId, token_id: String) {
    let state = state.clone();
    let conn = conn.clone();
    tokio::spawn(async move {
        let withdrawn = state
            .store
            .client_token_withdrawn(&token_id)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot check the token again; closing the socket");
                true
            });
        state.metrics.access_rechecked("client", !withdrawn);
        if withdrawn {
            state.presence.kick(&conn, Kick::TokenRevoked);
        }
    });
}

/// The socket task. Its setup runs before the future exists, and the future is a block
/// rather than an `async fn`: an async fn keeps every argument twice (the argument and the
/// local it is moved into), and this future is memory in every socket.
fn serve(
    state: SharedState,
    socket: WebSocket,
    client: Option<ClientIdentity>,
    cuts_seen: u64,
    conn: ConnId,
    permit: Permit,
) -> impl Future<Output = ()> + Send {
    let guard = state.socket_guard();
    let config = &state.config;
    let (mailbox, inbox) = Mailbox::new(config.queue_limits());
    state.presence.attach(conn.clone(), mailbox.clone());
    if let Some(identity) = &client {
        let cut_since = state
            .presence
            .set_client(&conn, identity.token_id.clone(), cuts_seen);
        if let (true, Some(token_id)) = (cut_since, identity.token_id.clone()) {
            recheck_token(&state, &conn, token_id);
        }
        tracing::debug!(subject = %identity.subject, "client connected");
    }
    let mut protocol = Protocol::new(state.clone(), conn.clone(), client);
    let mut role = protocol.role_label();
    state.metrics.connections.with_label_values(&[role]).inc();

    let (sink, mut stream) = socket.split();
    let (close_tx, close_rx) = oneshot::channel::<CloseRequest>();
    let dialect = Arc::new(AtomicBool::new(false));
    let mut writer = tokio::spawn(
        write_loop(
            sink,
            inbox.queue,
            close_rx,
            Writer {
                timeout: write_timeout(config),
                queue_len: config.send_queue,
                legacy: dialect.clone(),
            },
        )
        .in_current_span(),
    );
    let kick = inbox.kick;
    async move {
        let config = &state.config;
        let mut out = Outbox {
            state: &state,
            mailbox: &mailbox,
            strikes: Strikes::new(config.max_strikes, STRIKE_WINDOW),
            close: None,
            cut_off: false,
            for_cause: false,
        };

        let login_deadline = Instant::now() + Duration::from_secs(config.login_timeout_secs);
        let mut next_ping = Instant::now() + ping_every(config);
        let mut reading = Reading {
            limiter: RateLimiter::new(
                u64::from(config.rate_limit),
                u64::from(config.rate_burst),
                Instant::now(),
            ),
            last_heard: Instant::now(),
            peer_closed: false,
        };

        for welcome in protocol.welcome_at_open() {
            out.reply(welcome);
        }

        // Futures that live across loop turns are made once: building a timer entry or a watch
        // notification per message showed up in relay profiles. One timer serves the ping, the
        // deadline and the credentials refresh: each timer entry is memory in every socket.
        // Only the instant is kept: the error is worked out again when it comes (the
        // protocol state it depends on cannot change without a frame, which resets it).
        let mut deadline = protocol.deadline(login_deadline).map(|(at, _)| at);
        let mut refresh_at = protocol.credentials_refresh_at();
        let timer = sleep_until(tokio::time::Instant::from_std(next_wake(
            next_ping, deadline, refresh_at,
        )));
        tokio::pin!(timer);
        let kicked = kick.kicked();
        tokio::pin!(kicked);
        let mut writer_done = false;

        while out.close.is_none() {
            tokio::select! {
                biased;
                kick = &mut kicked => {
                    if kick == Kick::Revoked {
                        let error = WsError::Identity(crate::identity::IdentityError::Revoked);
                        out.error(&error, None);
                    }
                    out.for_cause = matches!(kick, Kick::Revoked | Kick::TokenRevoked);
                    out.close = Some(kick.close_frame());
                }
                _ = &mut writer => {
                    // The peer is gone or stopped reading: nothing more can reach it.
                    writer_done = true;
                    break;
                }
                frame = stream.next() => {
                    let now = Instant::now();
                    let text = match admit(frame, now, &mut reading, &mut out, &kick) {
                        Admitted::Text(text) => text,
                        Admitted::Handled => continue,
                        Admitted::Stop => break,
                    };
                    let result = protocol.handle(&text, now).await;
                    if protocol.legacy && !dialect.load(Ordering::Relaxed) {
                        dialect.store(true, Ordering::Relaxed);
                    }
                    for reply in protocol.replies.drain(..) {
                        out.reply(reply);
                    }
                    if let Err((error, id)) = result {
                        if matches!(error.code(), signalling_protocol::ErrorCode::InternalError) {
                            tracing::error!(error = %error, "message failed");
                        }
                        out.error(&error, id.as_deref());
                        match error.close() {
                            Some(close) => {
                                out.for_cause = true;
                                out.close = Some(close);
                            }
                            // A robot told that a client does not keep up is not at fault:
                            // a stalled viewer must not get the robot cut off for strikes.
                            None if matches!(error, WsError::Throttled) && protocol.is_robot() => {}
                            None => out.count_strike(now),
                        }
                    }
                    deadline = protocol.deadline(login_deadline).map(|(at, _)| at);
                    refresh_at = protocol.credentials_refresh_at();
                    let next = tokio::time::Instant::from_std(next_wake(next_ping, deadline, refresh_at));
                    if next != timer.deadline() {
                        timer.as_mut().reset(next);
                    }
                    let now_role = protocol.role_label();
                    if now_role != role {
                        state.metrics.connections.with_label_values(&[role]).dec();
                        state.metrics.connections.with_label_values(&[now_role]).inc();
                        role = now_role;
                    }
                }
                _ = &mut timer => {
                    let now = Instant::now();
                    if deadline.is_some_and(|at| at <= now) {
                        deadline = None;
                        if let Some((_, error)) = protocol.deadline(login_deadline) {
                            out.error(&error, None);
                            out.for_cause = true;
                            out.close = Some(error.close().unwrap_or((1008, "deadline")));
                            continue;
                        }
                    }
                    if refresh_at.is_some_and(|at| at <= now) {
                        protocol.refresh_credentials();
                        for reply in protocol.replies.drain(..) {
                            out.reply(reply);
                        }
                        refresh_at = protocol.credentials_refresh_at();
                    }
                    if next_ping <= now {
                        next_ping = now + ping_every(config);
                        if reading.last_heard.elapsed() > idle_timeout(config) {
                            // Likely dead; should it still read, it learns why (the writer
                            // gives up on the close within its timeout if not).
                            tracing::debug!("dropping dead connection");
                            out.close = Some((1008, "idle timeout"));
                            continue;
                        }
                        out.send(Outbound::Ping);
                    }
                    let next = next_wake(next_ping, deadline, refresh_at);
                    timer.as_mut().reset(tokio::time::Instant::from_std(next));
                }
            }
        }

        if out.cut_off {
            tracing::warn!(
                peer = %protocol.peer_label(),
                strikes = config.max_strikes,
                window_secs = STRIKE_WINDOW.as_secs(),
                "closing a peer that keeps earning errors or exceeding the rate limit"
            );
        }
        // Out of presence and sessions first: the peers must not wait on a socket that is
        // closing, whatever its writer is doing.
        state.metrics.connections.with_label_values(&[role]).dec();
        let resumable = !out.for_cause;
        Box::pin(state.sessions.detach(&conn, resumable)).await;
        match &protocol.peer {
            Peer::Robot { robot_id } => tracing::info!(robot = %robot_id, "robot disconnected"),
            Peer::Client(identity) => {
                tracing::debug!(subject = %identity.subject, "client disconnected")
            }
            Peer::Unverified { .. } => {}
        }
        let close = out.close;
        drop(out);
        drop(mailbox);
        if !writer_done {
            match close {
                Some(close) => {
                    let _ = close_tx.send(close);
                    if !reading.peer_closed {
                        // Our close: wait (bounded) for the peer's, reading what it still
                        // sends. Dropping the socket with unread input makes the kernel answer
                        // with a reset, which can overtake the close frame on its way.
                        let handshake = async {
                            while let Some(Ok(frame)) = stream.next().await {
                                if matches!(frame, Message::Close(_)) {
                                    break;
                                }
                            }
                        };
                        let _ = tokio::time::timeout(CLOSE_HANDSHAKE, handshake).await;
                    }
                }
                None => drop(close_tx),
            }
            // The writer sends what is queued and the close frame within its write timeout.
            if tokio::time::timeout(write_timeout(config) * 2, &mut writer)
                .await
                .is_err()
            {
                writer.abort();
            }
        }
        drop(guard);
        // The socket's place is free once everything above is done.
        drop(permit);
    }
}

/// What the reader knows of the frames it read.
struct Reading {
    limiter: RateLimiter,
    last_heard: Instant,
    /// The peer sent its close frame.
    peer_closed: bool,
}

/// What the reader makes of a frame before the protocol reads it.
enum Admitted {
    /// A text frame within every limit, for the protocol.
    Text(Utf8Bytes),
    /// Dealt with here (refused, counted as a strike, or a close asked for).
    Handled,
    /// Nothing more can be read.
    Stop,
}

/// The per-frame checks: close frames, strikes from other nodes, the rate limit, the frame
/// kind and size. A plain function, not part of the socket task: a frame's locals would
/// otherwise take room in every socket's future.
fn admit(
    frame: Option<Result<Message, axum::Error>>,
    now: Instant,
    reading: &mut Reading,
    out: &mut Outbox<'_>,
    kick: &KickReceiver,
) -> Admitted {
    let config = &out.state.config;
    let Some(frame) = frame else {
        return Admitted::Stop;
    };
    let frame = match frame {
        Ok(frame) => frame,
        Err(e) if is_too_large(&e) => {
            out.too_large();
            return Admitted::Handled;
        }
        Err(e) => {
            tracing::debug!(error = %e, "socket read failed");
            return Admitted::Stop;
        }
    };
    if matches!(frame, Message::Close(_)) {
        reading.peer_closed = true;
        out.close = Some((1000, "closed"));
        return Admitted::Handled;
    }
    reading.last_heard = now;
    // Refusals made on other nodes count as strikes too, as they would here.
    for _ in 0..kick.take_remote_strikes().min(config.max_strikes + 1) {
        out.count_strike(now);
        if out.close.is_some() {
            return Admitted::Handled;
        }
    }
    // Every frame counts against the rate limit: binary and control frames too.
    if !reading.limiter.allow(now) {
        out.strike(&WsError::RateLimited, now);
        return Admitted::Handled;
    }
    let text = match frame {
        Message::Text(text) => text,
        Message::Binary(bytes) => {
            if bytes.len() > config.max_frame_bytes {
                out.too_large();
            } else {
                out.strike(&WsError::Binary, now);
            }
            return Admitted::Handled;
        }
        _ => return Admitted::Handled,
    };
    if text.len() > config.max_frame_bytes {
        out.too_large();
        return Admitted::Handled;
    }
    Admitted::Text(text)
}

/// What the reader sends: replies and errors go through the socket's own queue, in order
/// with relayed messages, and every error is a strike.
struct Outbox<'a> {
    state: &'a SharedState,
    mailbox: &'a Mailbox,
    strikes: Strikes,
    /// Set once the socket is to close, with the close frame to send.
    close: Option<CloseRequest>,
    /// Closing for too many strikes (logged with who the peer is once the loop ends).
    cut_off: bool,
    /// Closing for cause (a credential withdrawn or expired, an error that ends the
    /// connection, a flood): its sessions end at once rather than wait to be resumed.
    for_cause: bool,
}

impl Outbox<'_> {
    fn send(&mut self, frame: Outbound) {
        match self.mailbox.send(None, frame) {
            Ok(()) => {}
            // Its own replies do not fit: the peer is not reading.
            Err(DeliveryError::Full) => {
                self.close.get_or_insert(Kick::SlowConsumer.close_frame());
            }
            Err(DeliveryError::Gone | DeliveryError::SenderThrottled) => {
                self.close.get_or_insert((1011, "internal error"));
            }
        }
    }

    fn reply(&mut self, text: String) {
        self.send(Outbound::text(text));
    }

    fn error(&mut self, error: &WsError, correlation: Option<&str>) {
        let code = error.code();
        self.state
            .metrics
            .errors
            .with_label_values(&[code.as_str()])
            .inc();
        let text = messages::error(code, &error.to_string(), error.details(), correlation);
        self.reply(text);
    }

    /// An error that does not close the socket by itself, counted as a strike.
    fn strike(&mut self, error: &WsError, now: Instant) {
        self.error(error, None);
        self.count_strike(now);
    }

    /// Too many strikes within the window close the socket, whatever came in between.
    fn count_strike(&mut self, now: Instant) {
        if self.strikes.strike(now) {
            let error = WsError::Flooding;
            self.cut_off = true;
            self.for_cause = true;
            self.state.metrics.peers_cut_off.inc();
            self.error(&error, None);
            self.close = error.close();
        }
    }

    fn too_large(&mut self) {
        let error = WsError::TooLarge {
            limit: self.state.config.max_frame_bytes,
        };
        self.error(&error, None);
        self.for_cause = true;
        self.close = Some(error.close().unwrap_or((1009, "frame too large")));
    }
}

/// How a socket's writer works.
struct Writer {
    /// Longest a batch of writes may take before the socket is given up.
    timeout: Duration,
    /// Most frames sent between a close request and the close frame.
    queue_len: usize,
    /// Set once the peer spoke the legacy flat dialect: frames are rendered for it.
    legacy: Arc<AtomicBool>,
}

impl Writer {
    /// The frame as this socket hears it; None for a message its dialect has no word for.
    fn message(&self, frame: Outbound) -> Option<Message> {
        match frame {
            Outbound::Text(text) if self.legacy.load(Ordering::Relaxed) => {
                legacy::render(&text).map(|flat| Message::Text(flat.into()))
            }
            Outbound::Text(text) => Some(Message::Text(text)),
            Outbound::Ping => Some(Message::Ping(Default::default())),
        }
    }
}

/// Sends queued frames, a batch per wake-up with one flush, until the queue closes, the
/// reader asks for a close, or a write makes no progress for the writer's timeout.
///
/// A block, not an `async fn` (see `serve`), and each batch with its timer goes on the heap
/// for as long as it is written: an idle socket's writer holds only what waits for work.
// Not an `async fn` on purpose: see the comment above.
#[allow(clippy::manual_async_fn)]
fn write_loop(
    mut sink: Sink,
    mut queue: QueueReceiver,
    mut close: oneshot::Receiver<CloseRequest>,
    writer: Writer,
) -> impl Future<Output = ()> + Send {
    async move {
        loop {
            tokio::select! {
                biased;
                request = &mut close => {
                    if let Ok((code, reason)) = request {
                        // What was queued before the close goes out first, bounded in count
                        // and time: peers may keep queueing, the close must not wait on them.
                        let closing = async {
                            for _ in 0..writer.queue_len {
                                let Some(frame) = queue.try_recv() else { break };
                                if let Some(message) = writer.message(frame) {
                                    sink.feed(message).await?;
                                }
                            }
                            sink.send(Message::Close(Some(CloseFrame {
                                code,
                                reason: reason.into(),
                            })))
                            .await?;
                            sink.close().await
                        };
                        let _ = Box::pin(tokio::time::timeout(writer.timeout, closing)).await;
                    }
                    return;
                }
                frame = queue.recv() => {
                    let Some(frame) = frame else { return };
                    let batch = async {
                        if let Some(message) = writer.message(frame) {
                            sink.feed(message).await?;
                        }
                        for _ in 1..WRITE_BATCH {
                            let Some(frame) = queue.try_recv() else { break };
                            if let Some(message) = writer.message(frame) {
                                sink.feed(message).await?;
                            }
                        }
                        sink.flush().await
                    };
                    match Box::pin(tokio::time::timeout(writer.timeout, batch)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "socket write failed");
                            return;
                        }
                        Err(_) => {
                            tracing::info!(
                                timeout_secs = writer.timeout.as_secs(),
                                "socket write timed out; closing"
                            );
                            return;
                        }
                    }
                }
            }
        }
    }
}

fn write_timeout(config: &Config) -> Duration {
    Duration::from_secs(config.write_timeout_secs.max(1))
}

fn ping_every(config: &Config) -> Duration {
    Duration::from_secs(config.ping_interval_secs.max(1))
}

fn idle_timeout(config: &Config) -> Duration {
    Duration::from_secs(config.idle_timeout_secs.max(1))
}

/// The socket's next timed duty: the next ping, the deadline or the credentials refresh,
/// whichever comes first.
fn next_wake(
    next_ping: Instant,
    deadline: Option<Instant>,
    refresh_at: Option<Instant>,
) -> Instant {
    [deadline, refresh_at]
        .into_iter()
        .flatten()
        .fold(next_ping, Instant::min)
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
