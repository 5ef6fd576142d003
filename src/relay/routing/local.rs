//! Delivery to the sockets of this node: the whole of routing on one node, and the part of
//! cluster routing that stays here.

use std::sync::Arc;

use crate::delivery::{Bus, ConnId, DeliveryError, Kick, Outbound, Sender};

/// Delivery to the sockets of this node.
pub struct LocalRouter {
    pub(super) bus: Arc<dyn Bus>,
}

impl LocalRouter {
    pub(super) fn new(bus: Arc<dyn Bus>) -> LocalRouter {
        LocalRouter { bus }
    }

    /// Queues a frame for a socket here. A receiver whose whole queue is full is closed
    /// instead of growing memory; a sender over its share is refused, the receiver left
    /// alone.
    pub(super) fn deliver(
        &self,
        from: Option<Sender<'_>>,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        let result = self.bus.deliver(from, to, message);
        if result == Err(DeliveryError::Full) {
            self.bus.kick(to, Kick::SlowConsumer);
        }
        result
    }
}
