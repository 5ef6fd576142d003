//! The bus: delivery of frames to sockets by id, and its local kind (sockets on this node).

use std::collections::HashMap;
use std::sync::Mutex;

use super::{ConnId, DeliveryError, Kick, Mailbox, Outbound, Sender};

/// Delivery of frames to sockets by id.
pub trait Bus: Send + Sync + 'static {
    fn attach(&self, conn: ConnId, mailbox: Mailbox);
    fn detach(&self, conn: &ConnId);
    /// Queues `message` for `to`; `from` says whose share it counts against (None: the
    /// server).
    fn deliver(
        &self,
        from: Option<Sender<'_>>,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError>;
    fn kick(&self, conn: &ConnId, reason: Kick);
    /// Counts a strike against `conn` for a frame of its that another node refused.
    fn strike(&self, conn: &ConnId);
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

    fn deliver(
        &self,
        from: Option<Sender<'_>>,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        // try_send never blocks, so it can run under the lock (no mailbox clone per message).
        let boxes = self.mailboxes.lock().map_err(|_| DeliveryError::Gone)?;
        boxes
            .get(to)
            .ok_or(DeliveryError::Gone)?
            .send(from, message)
    }

    fn strike(&self, conn: &ConnId) {
        if let Some(mailbox) = self.mailbox(conn) {
            mailbox.strike();
        }
    }

    fn kick(&self, conn: &ConnId, reason: Kick) {
        if let Some(mailbox) = self.mailbox(conn) {
            mailbox.kick(reason);
        }
    }
}
