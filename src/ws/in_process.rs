//! The connection runtime without a socket: a [`Handler`] fed text frames through a
//! channel by code in this process (the MCP endpoint runs a gateway session this way), with
//! everything else of `connection`'s: the admission permit held for the connection's life,
//! presence (kicks, token revocations), the handler's own events and deadlines, and its
//! replies through a bounded queue. There is no peer to ping: the owner ends the connection
//! by dropping its sender, and learns the close the handler asked for.

use std::time::Instant;

use tokio::sync::{mpsc, oneshot};
use tokio::time::sleep_until;
use tracing::Instrument;

use super::connection::{attach, CloseRequest, Handler, Inbound, Opening, Outbox};
use crate::auth::ClientIdentity;
use crate::relay::{ConnId, Mailbox, QueueReceiver};
use crate::state::SharedState;

/// Frames the owner may have queued for the handler at once.
const INBOUND: usize = 64;

/// The owner's ends of an in-process connection.
pub struct InProcess {
    /// Text frames for the handler, as a peer's. Dropping it ends the connection.
    pub to_handler: mpsc::Sender<String>,
    /// What the handler sends, in order; `None` once the connection ended and all is read.
    pub from_handler: QueueReceiver,
    /// The close the handler ended the connection with (none: it ended without one).
    pub closed: oneshot::Receiver<Option<CloseRequest>>,
}

/// Starts the connection's task, in `span`; `make` makes the handler once the connection
/// is in presence.
pub fn start<H: Handler>(
    state: SharedState,
    opening: Opening,
    span: tracing::Span,
    make: impl FnOnce(&SharedState, &ConnId, Option<ClientIdentity>) -> H,
) -> InProcess {
    let _entered = span.enter();
    let limits = state.config.socket_limits();
    let (mailbox, inbox) = Mailbox::new(limits.queue);
    attach(&state, &opening, &mailbox);
    let mut handler = make(&state, &opening.conn, opening.client.clone());
    let (mailbox, queue) = if H::READS_INBOX {
        handler.take_inbox(inbox.queue);
        let (own, own_inbox) = Mailbox::new(limits.queue);
        (own, own_inbox.queue)
    } else {
        (mailbox, inbox.queue)
    };
    let (to_handler, frames) = mpsc::channel(INBOUND);
    let (closed_tx, closed) = oneshot::channel();
    let task = run(
        state, handler, mailbox, inbox.kick, frames, closed_tx, opening,
    );
    drop(_entered);
    tokio::spawn(task.instrument(span));
    InProcess {
        to_handler,
        from_handler: queue,
        closed,
    }
}

async fn run<H: Handler>(
    state: SharedState,
    mut handler: H,
    mailbox: Mailbox,
    kick: crate::relay::KickReceiver,
    mut frames: mpsc::Receiver<String>,
    closed: oneshot::Sender<Option<CloseRequest>>,
    opening: Opening,
) {
    let guard = state.socket_guard();
    let mut out = Outbox::new(&state, &mailbox, &kick);
    handler.open(&mut out);
    let far = || tokio::time::Instant::now() + std::time::Duration::from_secs(3600);
    let at = |handler: &H| {
        handler
            .wake_at()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(far)
    };
    let timer = sleep_until(at(&handler));
    tokio::pin!(timer);
    let kicked = kick.kicked();
    tokio::pin!(kicked);
    while out.is_open() {
        tokio::select! {
            biased;
            kick = &mut kicked => handler.kicked(kick, &mut out),
            event = handler.event(), if H::READS_INBOX => {
                handler.on_event(event, &mut out).await;
            }
            frame = frames.recv() => match frame {
                Some(text) => {
                    handler.frame(Inbound::Text(text.into()), Instant::now(), &mut out).await;
                }
                // The owner is gone: nothing more can reach it.
                None => out.end(),
            },
            _ = &mut timer => {
                let now = Instant::now();
                if handler.wake_at().is_some_and(|due| due <= now) {
                    handler.wake(now, &mut out);
                }
            }
        }
        let next = at(&handler);
        if next != timer.deadline() {
            timer.as_mut().reset(next);
        }
    }
    Box::pin(handler.leave(&mut out)).await;
    let close = out.take_close();
    drop(out);
    drop(mailbox);
    let _ = closed.send(close);
    drop(handler);
    drop(guard);
    drop(opening.permit);
}
