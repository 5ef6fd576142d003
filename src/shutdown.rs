//! The signal that tells background work to stop: a leaf, so that whatever runs in the
//! background (tasks, the cluster's writer) can take one without importing its owner.

use tokio::sync::watch;

/// Handed to every background task: resolves once its owner stops.
#[derive(Clone)]
pub struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    /// A signal that fires when `sender` sends `true` (or is dropped).
    pub fn new(receiver: watch::Receiver<bool>) -> StopSignal {
        StopSignal(receiver)
    }

    /// Completes when the owner asks the tasks to stop (or is gone).
    pub async fn stopped(&mut self) {
        // An error means the sender is gone: the owner dropped, so stop as well.
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}
