use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

/// A socket's server-assigned id (the `connectionId` of its welcome).
pub type ConnId = Arc<str>;

/// A frame queued for a socket.
#[derive(Debug, Clone)]
pub enum Outbound {
    Text(String),
}

/// Why the server closes a socket from outside its own task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kick {
    /// A newer verified connection took over this robot id.
    Replaced,
    /// The robot's key or certificate was revoked, or the robot was deleted.
    Revoked,
    /// The client token was revoked.
    TokenRevoked,
    /// The socket did not drain its queue fast enough.
    SlowConsumer,
    Shutdown,
}

impl Kick {
    /// WebSocket close code and reason text.
    pub fn close_frame(self) -> (u16, &'static str) {
        match self {
            Kick::Replaced => (4001, "replaced by a newer connection"),
            Kick::Revoked => (4003, "credential revoked"),
            Kick::TokenRevoked => (4003, "token revoked"),
            Kick::SlowConsumer => (1008, "too slow to receive messages"),
            Kick::Shutdown => (1001, "server shutting down"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeliveryError {
    #[error("the receiving socket is gone")]
    Gone,
    #[error("the receiving socket's queue is full")]
    Full,
}

/// The sending half of a socket's queue and its kick switch.
#[derive(Clone)]
pub struct Mailbox {
    queue: mpsc::Sender<Outbound>,
    kick: Arc<watch::Sender<Option<Kick>>>,
}

/// What the socket task reads.
pub struct MailboxReceiver {
    pub queue: mpsc::Receiver<Outbound>,
    pub kick: watch::Receiver<Option<Kick>>,
}

impl Mailbox {
    /// A bounded queue: a socket that cannot keep up is closed, never buffered without limit.
    pub fn new(capacity: usize) -> (Mailbox, MailboxReceiver) {
        let (queue, queue_rx) = mpsc::channel(capacity);
        let (kick, kick_rx) = watch::channel(None);
        (
            Mailbox {
                queue,
                kick: Arc::new(kick),
            },
            MailboxReceiver {
                queue: queue_rx,
                kick: kick_rx,
            },
        )
    }

    fn send(&self, message: Outbound) -> Result<(), DeliveryError> {
        self.queue.try_send(message).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
            mpsc::error::TrySendError::Closed(_) => DeliveryError::Gone,
        })
    }

    fn kick(&self, reason: Kick) {
        // The first reason wins: a socket closed as revoked stays revoked.
        self.kick.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }
}

/// Delivery of frames to sockets by id.
pub trait Bus: Send + Sync + 'static {
    fn attach(&self, conn: ConnId, mailbox: Mailbox);
    fn detach(&self, conn: &ConnId);
    fn deliver(&self, to: &ConnId, message: Outbound) -> Result<(), DeliveryError>;
    fn kick(&self, conn: &ConnId, reason: Kick);
}

/// Sockets on this node.
#[derive(Default)]
pub struct LocalBus {
    mailboxes: Mutex<HashMap<ConnId, Mailbox>>,
}

impl LocalBus {
    fn mailbox(&self, conn: &ConnId) -> Option<Mailbox> {
        self.mailboxes
            .lock()
            .ok()
            .and_then(|boxes| boxes.get(conn).cloned())
    }
}

impl Bus for LocalBus {
    fn attach(&self, conn: ConnId, mailbox: Mailbox) {
        if let Ok(mut boxes) = self.mailboxes.lock() {
            boxes.insert(conn, mailbox);
        }
    }

    fn detach(&self, conn: &ConnId) {
        if let Ok(mut boxes) = self.mailboxes.lock() {
            boxes.remove(conn);
        }
    }

    fn deliver(&self, to: &ConnId, message: Outbound) -> Result<(), DeliveryError> {
        // try_send never blocks, so it can run under the lock (no mailbox clone per message).
        let boxes = self.mailboxes.lock().map_err(|_| DeliveryError::Gone)?;
        boxes.get(to).ok_or(DeliveryError::Gone)?.send(message)
    }

    fn kick(&self, conn: &ConnId, reason: Kick) {
        if let Some(mailbox) = self.mailbox(conn) {
            mailbox.kick(reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_queue_is_reported_not_buffered() {
        let bus = LocalBus::default();
        let (mailbox, mut rx) = Mailbox::new(1);
        let id: ConnId = Arc::from("a");
        bus.attach(id.clone(), mailbox);
        assert_eq!(bus.deliver(&id, Outbound::Text("1".into())), Ok(()));
        assert_eq!(
            bus.deliver(&id, Outbound::Text("2".into())),
            Err(DeliveryError::Full)
        );
        assert!(matches!(rx.queue.try_recv(), Ok(Outbound::Text(t)) if t == "1"));
        bus.kick(&id, Kick::Revoked);
        bus.kick(&id, Kick::Shutdown);
        assert_eq!(*rx.kick.borrow(), Some(Kick::Revoked));
        bus.detach(&id);
        assert_eq!(
            bus.deliver(&id, Outbound::Text("3".into())),
            Err(DeliveryError::Gone)
        );
    }
}
