//! The one connection runtime every WebSocket of the server runs on, `/ws` signalling and
//! the ARP gateway alike: the admission permit held for the socket's life, the attach to
//! presence and the token re-check after a revocation race, a reader task that owns every
//! deadline (idle, pings, the handler's own) and a writer task that sends the socket's
//! bounded queue, and a close with a reason. What a frame means is the [`Handler`]'s.
//!
//! Nothing here awaits a send, so a peer that never reads cannot hold back its own
//! deadlines or kick, and a writer that makes no progress for the write timeout gives up.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket};
use futures_util::stream::SplitStream;
use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Sleep};
use tracing::Instrument;

use super::heartbeat::{Beat, Heartbeat};
pub use super::writer::CloseRequest;
use super::writer::{spawn_writer, Closing};
use crate::admission::Permit;
use crate::auth::ClientIdentity;
use crate::config::SocketLimits;
use crate::relay::{ConnId, DeliveryError, Kick, KickReceiver, Mailbox, Outbound, QueueReceiver};
use crate::state::SharedState;

/// A frame the runtime passes on: close frames it handles itself.
pub enum Inbound {
    Text(Utf8Bytes),
    Binary(usize),
    /// A ping or a pong (it counts as heard, and against rate limits).
    Control,
    /// Past the transport's size limit: not even read.
    TooLarge,
}

/// One protocol spoken on the runtime's sockets (mini-redis's `Handler` over its
/// `Connection`): the socket loop stays the same, the meaning of frames is the handler's.
pub trait Handler: Send + Sized + 'static {
    /// What the handler waits for besides frames, kicks and timers.
    type Event: Send;

    /// Whether the handler reads the socket's presence mailbox itself ([`Handler::event`]):
    /// then the writer gets a queue of its own. Otherwise what others queue for the socket
    /// goes straight to its writer.
    const READS_INBOX: bool;

    /// Takes the presence mailbox's queue (only when [`Handler::READS_INBOX`]).
    fn take_inbox(&mut self, _inbox: QueueReceiver) {}

    /// The socket is open: what to send first.
    fn open(&mut self, out: &mut Outbox<'_>);

    /// One frame within the transport's limits; `now` is when it was read.
    fn frame(
        &mut self,
        frame: Inbound,
        now: Instant,
        out: &mut Outbox<'_>,
    ) -> impl Future<Output = ()> + Send;

    /// The next of the handler's own events; never resolves for a handler without them.
    fn event(&mut self) -> impl Future<Output = Self::Event> + Send;

    /// One of the handler's events.
    fn on_event(
        &mut self,
        event: Self::Event,
        out: &mut Outbox<'_>,
    ) -> impl Future<Output = ()> + Send;

    /// The handler's next timed duty (a login or token deadline, a refresh), if any.
    fn wake_at(&self) -> Option<Instant>;

    /// Its time came (or passed): does what is due.
    fn wake(&mut self, now: Instant, out: &mut Outbox<'_>);

    /// Kicked from outside the socket (replaced, revoked, too slow, shutting down).
    fn kicked(&mut self, kick: Kick, out: &mut Outbox<'_>);

    /// The peer is taken for dead (nothing heard for the idle timeout).
    fn idle(&mut self, out: &mut Outbox<'_>) {
        tracing::debug!("dropping dead connection");
        out.close((1008, "idle timeout".into()));
    }

    /// Whether the peer speaks the legacy flat dialect (its frames are rendered flat).
    fn legacy(&self) -> bool {
        false
    }

    /// Out of presence and sessions, once the socket is done reading; what is still sent
    /// (through `out`) goes before the close frame.
    fn leave(&mut self, out: &mut Outbox<'_>) -> impl Future<Output = ()> + Send;
}

/// A socket, ready for the runtime: its upgrade passed every check.
pub struct Opening {
    pub conn: ConnId,
    /// The client's identity, if it gave a token.
    pub client: Option<ClientIdentity>,
    /// The hub's count of access cuts, read before the token was checked.
    pub cuts_seen: u64,
    pub permit: Permit,
}

/// Starts the socket's tasks, in `span`. Called from axum's upgrade task, which ends right
/// after: that wrapper keeps its captures for as long as the future it runs, a few hundred
/// bytes in every socket, so the socket task is spawned on its own. `handler` makes the
/// handler once the socket is attached.
pub fn start<H: Handler>(
    state: SharedState,
    socket: WebSocket,
    opening: Opening,
    span: tracing::Span,
    handler: impl FnOnce(&SharedState, &ConnId, Option<ClientIdentity>) -> H + 'static,
) {
    let task = span.in_scope(|| serve(state, socket, opening, handler));
    tokio::spawn(task.instrument(span));
}

/// A token revocation came between this client's token check and its registration, and may
/// have missed the socket: check the token again (on its own task, so the socket's stays
/// small) and close the socket if it was withdrawn. Fails closed.
fn recheck_token(state: &SharedState, conn: &ConnId, token_id: String) {
    let state = state.clone();
    let conn = conn.clone();
    tokio::spawn(
        async move {
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
        }
        .in_current_span(),
    );
}

/// Into presence: the socket's mailbox, and the client's token with the re-check a
/// revocation race calls for.
pub(super) fn attach(state: &SharedState, opening: &Opening, mailbox: &Mailbox) {
    state.presence.attach(opening.conn.clone(), mailbox.clone());
    let Some(identity) = &opening.client else {
        return;
    };
    let cut_since =
        state
            .presence
            .set_client(&opening.conn, identity.token_id.clone(), opening.cuts_seen);
    if let (true, Some(token_id)) = (cut_since, identity.token_id.clone()) {
        recheck_token(state, &opening.conn, token_id);
    }
}

/// What the socket task owns.
struct Socket<H> {
    state: SharedState,
    handler: H,
    /// The queue the handler's replies go to (the writer's).
    mailbox: Mailbox,
    kick: KickReceiver,
    stream: SplitStream<WebSocket>,
    writer: JoinHandle<()>,
    guard: crate::state::SocketGuard,
    permit: Permit,
}

/// The socket's setup, before its task exists: presence, the handler, the writer task.
fn serve<H: Handler>(
    state: SharedState,
    socket: WebSocket,
    opening: Opening,
    make: impl FnOnce(&SharedState, &ConnId, Option<ClientIdentity>) -> H + 'static,
) -> impl Future<Output = ()> + Send {
    let limits = state.config.socket_limits();
    let guard = state.socket_guard();
    let (mailbox, inbox) = Mailbox::new(limits.queue);
    attach(&state, &opening, &mailbox);
    let mut handler = make(&state, &opening.conn, opening.client);
    // A handler that reads the presence mailbox itself writes through a queue of its own.
    let (mailbox, queue) = if H::READS_INBOX {
        handler.take_inbox(inbox.queue);
        let (own, own_inbox) = Mailbox::new(limits.queue);
        (own, own_inbox.queue)
    } else {
        (mailbox, inbox.queue)
    };
    let (sink, stream) = socket.split();
    let writer = spawn_writer(sink, queue, limits);
    run(Socket {
        state,
        handler,
        mailbox,
        kick: inbox.kick,
        stream,
        writer,
        guard,
        permit: opening.permit,
    })
}

/// The socket task: reads until the socket is to close, then leaves and closes. A block
/// rather than an `async fn`: an async fn keeps every argument twice (the argument and the
/// local it is moved into), and this future is memory in every socket. For the same reason
/// it borrows the limits from the state it holds rather than keep a copy.
// Not an `async fn` on purpose: see the comment above.
#[allow(clippy::manual_async_fn)]
fn run<H: Handler>(mut socket: Socket<H>) -> impl Future<Output = ()> + Send {
    async move {
        let handler = &mut socket.handler;
        let mut out = Outbox::new(&socket.state, &socket.mailbox, &socket.kick);
        let (mut last_heard, mut peer_closed) = (Instant::now(), false);
        handler.open(&mut out);
        let mut heartbeat = Heartbeat::new(Instant::now(), out.limits());
        // Futures that live across loop turns are made once: building a timer entry or a
        // watch notification per message showed up in relay profiles. One timer serves the
        // ping and the handler's duties: each timer entry is memory in every socket.
        let timer = sleep_until(next_wake(&heartbeat, handler));
        tokio::pin!(timer);
        let kicked = socket.kick.kicked();
        tokio::pin!(kicked);
        let mut writer_done = false;
        while out.is_open() {
            tokio::select! {
                biased;
                kick = &mut kicked => handler.kicked(kick, &mut out),
                _ = &mut socket.writer => {
                    // The peer is gone or stopped reading: nothing more can reach it.
                    writer_done = true;
                    break;
                }
                event = handler.event(), if H::READS_INBOX => {
                    handler.on_event(event, &mut out).await;
                    reset_timer(&heartbeat, handler, timer.as_mut());
                }
                frame = socket.stream.next() => {
                    let now = Instant::now();
                    let frame = match read(frame, &mut out) {
                        Read::Frame(frame) => frame,
                        Read::Closed => {
                            peer_closed = true;
                            continue;
                        }
                        Read::Stop => break,
                    };
                    last_heard = now;
                    handler.frame(frame, now, &mut out).await;
                    if handler.legacy() {
                        // The writer renders what it sends flat from now on.
                        socket.mailbox.speaks_flat();
                    }
                    reset_timer(&heartbeat, handler, timer.as_mut());
                }
                _ = &mut timer => tick(handler, &mut heartbeat, last_heard, &mut out, timer.as_mut()),
            }
        }
        // Out of presence and sessions first, once the socket is done reading: the peers
        // must not wait on a socket that is closing, whatever its writer is doing. On the
        // heap, as the close below: the socket task keeps only what waits for frames.
        Box::pin(handler.leave(&mut out)).await;
        let close = out.close.take();
        drop(out);
        if !writer_done {
            let write_timeout = socket.state.config.socket_limits().write_timeout;
            let closing = Closing::new(close, peer_closed, write_timeout);
            Box::pin(closing.run(&socket.mailbox, &mut socket.stream, &mut socket.writer)).await;
        }
        // The queue closes only once the close was asked for: a writer (on another thread)
        // that saw its queue close first ended without the close frame, and the peer got an
        // end of stream with no code (seen once in the cluster suite: a revoked robot).
        drop(socket.mailbox);
        drop(socket.handler);
        drop(socket.guard);
        // The socket's place is free once everything above is done.
        drop(socket.permit);
    }
}

/// The timer fired: the handler's duty if it is due, then the ping (or, for a peer
/// silent past the idle timeout, the end), and the timer set for the next duty.
fn tick<H: Handler>(
    handler: &mut H,
    heartbeat: &mut Heartbeat,
    last_heard: Instant,
    out: &mut Outbox<'_>,
    timer: Pin<&mut Sleep>,
) {
    let now = Instant::now();
    if handler.wake_at().is_some_and(|at| at <= now) {
        handler.wake(now, out);
    }
    if out.is_open() {
        match heartbeat.due(now, last_heard, out.limits()) {
            Some(Beat::Idle) => handler.idle(out),
            Some(Beat::Ping) => out.send(Outbound::Ping),
            None => {}
        }
    }
    timer.reset(next_wake(heartbeat, handler));
}

/// The socket's next timed duty: the next ping or the handler's, whichever comes first.
fn next_wake<H: Handler>(heartbeat: &Heartbeat, handler: &H) -> tokio::time::Instant {
    let at = match handler.wake_at() {
        Some(at) => at.min(heartbeat.next_ping()),
        None => heartbeat.next_ping(),
    };
    tokio::time::Instant::from_std(at)
}

/// A frame or an event may have moved the handler's duties (a login, a new token).
fn reset_timer<H: Handler>(heartbeat: &Heartbeat, handler: &H, timer: Pin<&mut Sleep>) {
    let next = next_wake(heartbeat, handler);
    if next != timer.deadline() {
        timer.reset(next);
    }
}

/// What the reader makes of what the stream gave.
enum Read {
    Frame(Inbound),
    /// The peer sent its close frame: the server answers it.
    Closed,
    /// Nothing more can be read.
    Stop,
}

/// A plain function, not part of the socket task: a frame's locals would otherwise take
/// room in every socket's future.
fn read(frame: Option<Result<Message, axum::Error>>, out: &mut Outbox<'_>) -> Read {
    let frame = match frame {
        None => return Read::Stop,
        Some(Ok(frame)) => frame,
        Some(Err(e)) if is_too_large(&e) => return Read::Frame(Inbound::TooLarge),
        Some(Err(e)) => {
            tracing::debug!(error = %e, "socket read failed");
            return Read::Stop;
        }
    };
    Read::Frame(match frame {
        Message::Text(text) => Inbound::Text(text),
        Message::Binary(bytes) => Inbound::Binary(bytes.len()),
        Message::Ping(_) | Message::Pong(_) => Inbound::Control,
        Message::Close(_) => {
            out.close((1000, "closed".into()));
            return Read::Closed;
        }
    })
}

/// The close frame a kick ends the socket with.
pub fn kick_close(kick: Kick) -> CloseRequest {
    let (code, reason) = kick.close_frame();
    (code, reason.into())
}

/// What the reader sends: the handler's replies go through the socket's own queue, in
/// order with what others queue for it; and how the socket is to end.
pub struct Outbox<'a> {
    pub state: &'a SharedState,
    mailbox: &'a Mailbox,
    pub kick: &'a KickReceiver,
    /// Set once the socket is to close, with the close frame to send.
    close: Option<CloseRequest>,
    /// Ending without a close frame (the peer is gone).
    gone: bool,
}

impl<'a> Outbox<'a> {
    pub(super) fn new(
        state: &'a SharedState,
        mailbox: &'a Mailbox,
        kick: &'a KickReceiver,
    ) -> Self {
        Outbox {
            state,
            mailbox,
            kick,
            close: None,
            gone: false,
        }
    }

    /// The socket's limits (a reference is not kept: it would be memory in every socket).
    pub fn limits(&self) -> &'a SocketLimits {
        self.state.config.socket_limits()
    }

    /// Whether the socket still reads: no close asked for, the peer not gone.
    pub fn is_open(&self) -> bool {
        self.close.is_none() && !self.gone
    }

    /// Closes the socket with this frame (the first close asked for stands).
    pub fn close(&mut self, close: CloseRequest) {
        self.close.get_or_insert(close);
    }

    /// Closes the socket with this frame, over any asked for before.
    pub fn close_now(&mut self, close: CloseRequest) {
        self.close = Some(close);
    }

    /// The close asked for, taken once the connection is done.
    pub(super) fn take_close(&mut self) -> Option<CloseRequest> {
        self.close.take()
    }

    /// Ends the socket without a close frame: nothing more can reach the peer.
    pub fn end(&mut self) {
        self.gone = true;
    }

    pub fn send(&mut self, frame: Outbound) {
        match self.mailbox.send(None, frame) {
            Ok(()) => {}
            // Its own replies do not fit: the peer is not reading.
            Err(DeliveryError::Full) => self.close(kick_close(Kick::SlowConsumer)),
            Err(DeliveryError::Gone | DeliveryError::SenderThrottled) => {
                self.close((1011, "internal error".into()))
            }
        }
    }

    pub fn reply(&mut self, text: String) {
        self.send(Outbound::text(text));
    }
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
