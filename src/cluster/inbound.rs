//! What other nodes send to this one: one subscription for the node (its own channel and the
//! broadcasts), opened again after Redis comes back, handed to the node's [`PeerHandler`]
//! (the relay's routing applies it).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::link::Subscription;
use super::{Cluster, ClusterError, Control, PeerMessage, RelayedFrame, PRESENCE_WAIT};
use crate::shutdown::StopSignal;

/// Longest wait between two attempts to subscribe again while Redis is away.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// What a node does with what its peers send.
pub trait PeerHandler: Send + Sync + 'static {
    /// Frames relayed by other nodes for sockets here.
    fn frames(&self, frames: Vec<RelayedFrame>);
    /// A control message from the node `origin` (another node: this node's own broadcasts
    /// are dropped here, and probes and leave notices are the cluster's own).
    fn control(
        &self,
        origin: String,
        control: Control,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

impl Cluster {
    /// One subscription for the whole node: its own channel and the broadcast channel.
    pub async fn subscribe(&self) -> Result<Subscription, ClusterError> {
        let own = self.node_channel(&self.node);
        let all = self.broadcast_channel();
        let work = async { Subscription::open(&self.bus, &[own.as_bytes(), all.as_bytes()]).await };
        let subscription = tokio::time::timeout(PRESENCE_WAIT, work)
            .await
            .unwrap_or(Err(ClusterError::Timeout(PRESENCE_WAIT)))?;
        self.set_subscribed(true);
        Ok(subscription)
    }

    pub fn count_received(&self, kind: &'static str) {
        self.metrics
            .cluster
            .messages
            .with_label_values(&["received", kind])
            .inc();
    }
}

/// Receives what other nodes send to this one, resubscribing after Redis comes back.
pub async fn listen(cluster: Arc<Cluster>, handler: Arc<dyn PeerHandler>, mut stop: StopSignal) {
    let mut retry = Duration::from_millis(100);
    loop {
        let subscription = tokio::select! {
            _ = stop.stopped() => return,
            subscription = cluster.subscribe() => subscription,
        };
        match subscription {
            Ok(mut subscription) => {
                retry = Duration::from_millis(100);
                tracing::info!(node = cluster.node_id(), "subscribed to the cluster bus");
                let lost = loop {
                    let message = tokio::select! {
                        _ = stop.stopped() => return,
                        message = subscription.next() => message,
                    };
                    match message {
                        Ok(Ok(message)) => handle(&cluster, handler.as_ref(), message).await,
                        Ok(Err(e)) => tracing::warn!(error = %e, "ignoring a bus message"),
                        Err(e) => break e,
                    }
                };
                cluster.set_subscribed(false);
                tracing::error!(error = %lost, "lost the cluster bus subscription; retrying");
            }
            Err(e) => {
                cluster.set_subscribed(false);
                tracing::debug!(error = %e, "cannot subscribe to the cluster bus");
            }
        }
        tokio::select! {
            _ = stop.stopped() => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(RETRY_MAX);
    }
}

async fn handle(cluster: &Cluster, handler: &dyn PeerHandler, message: PeerMessage) {
    let (origin, control) = match message {
        PeerMessage::Frames(frames) => {
            cluster.count_received_frames(frames.len());
            handler.frames(frames);
            return;
        }
        PeerMessage::Control { origin, control } => (origin, control),
    };
    // Broadcasts come back to their sender too; it already acted on them.
    if origin == cluster.node_id() && !matches!(control, Control::Probe { .. }) {
        return;
    }
    cluster.count_received(control.kind());
    match control {
        Control::NodeLeaving => {
            tracing::info!(node = %origin, "a node is draining; its robots will reconnect elsewhere")
        }
        Control::Probe { sent_unix_ms } => cluster.observe_probe(sent_unix_ms),
        control => handler.control(origin, control).await,
    }
}
