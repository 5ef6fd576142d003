//! One socket, as two tasks: this one reads frames, enforces limits, deadlines and kicks;
//! a writer task sends queued frames. Nothing here awaits a send, so a peer that never
//! reads cannot hold back its own login deadline, idle timeout or kick, and a writer that
//! makes no progress for the write timeout gives up on the socket.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Sleep};
use tracing::Instrument;

use super::error::WsError;
use super::heartbeat::{Beat, Heartbeat};
use super::legacy;
use super::protocol::{Peer, Protocol};
use crate::admission::Permit;
use crate::auth::ClientIdentity;
use crate::config::SocketLimits;
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
/// local it is moved into), and this future is memory in every socket. For the same reason
/// it borrows the limits from the state it holds rather than keep a copy.
fn serve(
    state: SharedState,
    socket: WebSocket,
    client: Option<ClientIdentity>,
    cuts_seen: u64,
    conn: ConnId,
    permit: Permit,
) -> impl Future<Output = ()> + Send {
    let limits = state.config.socket_limits();
    let guard = state.socket_guard();
    let (mailbox, inbox) = Mailbox::new(limits.queue);
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
    let mut writer = spawn_writer(sink, inbox.queue, close_rx, limits, dialect.clone());
    let kick = inbox.kick;
    async move {
        let mut out = Outbox::new(&state, &mailbox);
        let mut reading = Reading::new(out.limits(), Instant::now());
        for welcome in protocol.welcome_at_open() {
            out.reply(welcome);
        }
        // After the welcome: it may set when the credentials it gave need a refresh.
        let mut duties = Duties::new(&protocol, out.limits());

        // Futures that live across loop turns are made once: building a timer entry or a watch
        // notification per message showed up in relay profiles. One timer serves the ping, the
        // deadline and the credentials refresh: each timer entry is memory in every socket.
        let timer = sleep_until(duties.next_wake());
        tokio::pin!(timer);
        let kicked = kick.kicked();
        tokio::pin!(kicked);
        let mut writer_done = false;

        while out.close.is_none() {
            tokio::select! {
                biased;
                kick = &mut kicked => out.kicked(kick),
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
                    out.handled(&mut protocol, result, now);
                    duties.after_frame(&protocol, timer.as_mut());
                    role = recount_role(&state, role, protocol.role_label());
                }
                _ = &mut timer => duties.due(&mut protocol, &mut out, &reading, timer.as_mut()),
            }
        }

        let (close, for_cause) = (out.close, out.for_cause);
        out.log_cut_off(&protocol);
        drop(out);
        Box::pin(leave(&state, &conn, &protocol, role, !for_cause)).await;
        drop(mailbox);
        if !writer_done {
            let closing = Closing {
                close,
                close_tx,
                peer_closed: reading.peer_closed,
                write_timeout: state.config.socket_limits().write_timeout,
            };
            Box::pin(closing.run(&mut stream, &mut writer)).await;
        }
        drop(guard);
        // The socket's place is free once everything above is done.
        drop(permit);
    }
}

/// Starts the socket's writer task, in the socket's span.
fn spawn_writer(
    sink: Sink,
    queue: QueueReceiver,
    close: oneshot::Receiver<CloseRequest>,
    limits: &SocketLimits,
    legacy: Arc<AtomicBool>,
) -> JoinHandle<()> {
    let writer = Writer {
        timeout: limits.write_timeout,
        queue_len: limits.close_drain,
        legacy,
    };
    tokio::spawn(write_loop(sink, queue, close, writer).in_current_span())
}

/// Moves the socket's count in the connections gauge to the role it has now; returns it.
fn recount_role(state: &SharedState, was: &'static str, now: &'static str) -> &'static str {
    if now != was {
        state.metrics.connections.with_label_values(&[was]).dec();
        state.metrics.connections.with_label_values(&[now]).inc();
    }
    now
}

/// Out of presence and sessions first, once the socket is done reading: the peers must not
/// wait on a socket that is closing, whatever its writer is doing. Runs on the heap, as
/// the close below: the socket task keeps only what waits for frames.
async fn leave(
    state: &SharedState,
    conn: &ConnId,
    protocol: &Protocol,
    role: &'static str,
    resumable: bool,
) {
    state.metrics.connections.with_label_values(&[role]).dec();
    state.sessions.detach(conn, resumable).await;
    match &protocol.peer {
        Peer::Robot { robot_id } => tracing::info!(robot = %robot_id, "robot disconnected"),
        Peer::Client(identity) => {
            tracing::debug!(subject = %identity.subject, "client disconnected")
        }
        Peer::Unverified { .. } => {}
    }
}

/// How the socket ends once the reader is done and the writer still runs.
struct Closing {
    /// The close frame the server sends, if it closes the socket.
    close: Option<CloseRequest>,
    close_tx: oneshot::Sender<CloseRequest>,
    /// The peer sent its close frame already.
    peer_closed: bool,
    write_timeout: Duration,
}

impl Closing {
    async fn run(self, stream: &mut SplitStream<WebSocket>, writer: &mut JoinHandle<()>) {
        match self.close {
            Some(close) => {
                let _ = self.close_tx.send(close);
                if !self.peer_closed {
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
            None => drop(self.close_tx),
        }
        // The writer sends what is queued and the close frame within its write timeout.
        if tokio::time::timeout(self.write_timeout * 2, &mut *writer)
            .await
            .is_err()
        {
            writer.abort();
        }
    }
}

/// The socket's timed duties: the ping (and the idle check with it), the login or token
/// deadline and the credentials refresh, all on one timer.
struct Duties {
    login_deadline: Instant,
    heartbeat: Heartbeat,
    /// Only the instant is kept: the error is worked out again when it comes (the
    /// protocol state it depends on cannot change without a frame, which resets it).
    deadline: Option<Instant>,
    refresh_at: Option<Instant>,
}

impl Duties {
    fn new(protocol: &Protocol, limits: &SocketLimits) -> Duties {
        let login_deadline = Instant::now() + limits.login_timeout;
        Duties {
            login_deadline,
            heartbeat: Heartbeat::new(Instant::now(), limits),
            deadline: protocol.deadline(login_deadline).map(|(at, _)| at),
            refresh_at: protocol.credentials_refresh_at(),
        }
    }

    /// Whichever comes first.
    fn next_wake(&self) -> tokio::time::Instant {
        tokio::time::Instant::from_std(next_wake(
            self.heartbeat.next_ping(),
            self.deadline,
            self.refresh_at,
        ))
    }

    /// A frame may have moved the deadline or the refresh (a login, a new token).
    fn after_frame(&mut self, protocol: &Protocol, timer: Pin<&mut Sleep>) {
        self.deadline = protocol.deadline(self.login_deadline).map(|(at, _)| at);
        self.refresh_at = protocol.credentials_refresh_at();
        let next = self.next_wake();
        if next != timer.deadline() {
            timer.reset(next);
        }
    }

    /// The timer fired: does what is due, then sets it for the next duty (unless closing).
    fn due(
        &mut self,
        protocol: &mut Protocol,
        out: &mut Outbox<'_>,
        reading: &Reading,
        timer: Pin<&mut Sleep>,
    ) {
        let now = Instant::now();
        if self.deadline.is_some_and(|at| at <= now) {
            self.deadline = None;
            if let Some((_, error)) = protocol.deadline(self.login_deadline) {
                out.error(&error, None);
                out.for_cause = true;
                out.close = Some(error.close().unwrap_or((1008, "deadline")));
                return;
            }
        }
        if self.refresh_at.is_some_and(|at| at <= now) {
            protocol.refresh_credentials();
            for reply in protocol.replies.drain(..) {
                out.reply(reply);
            }
            self.refresh_at = protocol.credentials_refresh_at();
        }
        match self.heartbeat.due(now, reading.last_heard, out.limits()) {
            Some(Beat::Idle) => {
                // Likely dead; should it still read, it learns why (the writer gives up on
                // the close within its timeout if not).
                tracing::debug!("dropping dead connection");
                out.close = Some((1008, "idle timeout"));
                return;
            }
            Some(Beat::Ping) => out.send(Outbound::Ping),
            None => {}
        }
        timer.reset(self.next_wake());
    }
}

/// What the reader knows of the frames it read.
struct Reading {
    limiter: RateLimiter,
    last_heard: Instant,
    /// The peer sent its close frame.
    peer_closed: bool,
}

impl Reading {
    fn new(limits: &SocketLimits, now: Instant) -> Reading {
        Reading {
            limiter: RateLimiter::new(limits.rate, limits.burst, now),
            last_heard: now,
            peer_closed: false,
        }
    }
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
    let limits = out.limits();
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
    for _ in 0..kick.take_remote_strikes().min(limits.max_strikes + 1) {
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
            if bytes.len() > limits.max_frame_bytes {
                out.too_large();
            } else {
                out.strike(&WsError::Binary, now);
            }
            return Admitted::Handled;
        }
        _ => return Admitted::Handled,
    };
    if text.len() > limits.max_frame_bytes {
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

impl<'a> Outbox<'a> {
    fn new(state: &'a SharedState, mailbox: &'a Mailbox) -> Self {
        Outbox {
            state,
            mailbox,
            strikes: Strikes::new(state.config.socket_limits().max_strikes, STRIKE_WINDOW),
            close: None,
            cut_off: false,
            for_cause: false,
        }
    }

    /// Kicked from outside the task (replaced, revoked, too slow, shutting down).
    fn kicked(&mut self, kick: Kick) {
        if kick == Kick::Revoked {
            let error = WsError::Identity(crate::identity::IdentityError::Revoked);
            self.error(&error, None);
        }
        self.for_cause = matches!(kick, Kick::Revoked | Kick::TokenRevoked);
        self.close = Some(kick.close_frame());
    }

    /// Sends what the protocol made of a frame: its replies, then its error if any, which
    /// closes the socket or counts as a strike.
    fn handled(
        &mut self,
        protocol: &mut Protocol,
        result: Result<(), (WsError, Option<String>)>,
        now: Instant,
    ) {
        for reply in protocol.replies.drain(..) {
            self.reply(reply);
        }
        let Err((error, id)) = result else { return };
        if matches!(error.code(), signalling_protocol::ErrorCode::InternalError) {
            tracing::error!(error = %error, "message failed");
        }
        self.error(&error, id.as_deref());
        match error.close() {
            Some(close) => {
                self.for_cause = true;
                self.close = Some(close);
            }
            // A robot told that a client does not keep up is not at fault: a stalled
            // viewer must not get the robot cut off for strikes.
            None if matches!(error, WsError::Throttled) && protocol.is_robot() => {}
            None => self.count_strike(now),
        }
    }

    /// The socket's limits (a reference is not kept: it would be memory in every socket).
    fn limits(&self) -> &'a SocketLimits {
        self.state.config.socket_limits()
    }

    /// Closing for too many strikes is logged with who the peer is, once the loop ends.
    fn log_cut_off(&self, protocol: &Protocol) {
        if self.cut_off {
            tracing::warn!(
                peer = %protocol.peer_label(),
                strikes = self.limits().max_strikes,
                window_secs = STRIKE_WINDOW.as_secs(),
                "closing a peer that keeps earning errors or exceeding the rate limit"
            );
        }
    }

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
            limit: self.limits().max_frame_bytes,
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
