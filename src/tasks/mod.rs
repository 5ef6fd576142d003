//! Background work that lives as long as the server: the CRL watcher, the JWKS refresh,
//! the end of sessions not resumed in time, the renewal of session tickets and, on several
//! nodes, the workers the relay's cluster routing hands over (its bus writer, subscription
//! and heartbeat: [`crate::relay::workers`]).
//!
//! Every task is started through [`Tasks`], which owns it: [`Tasks::stop`] tells the tasks
//! to finish through a shared stop signal and waits for them, and dropping `Tasks` aborts
//! whatever is still running (the guard habit of mini-redis's `DbDropGuard`), so nothing
//! outlives the server that started it.

pub mod crl;
pub mod jwks;
pub mod resume;
pub mod tickets;

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use crate::shutdown::StopSignal;

/// How long [`Tasks::stop`] waits for a task before aborting it.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// The tasks of one server, and the switch that stops them.
pub struct Tasks {
    stop: watch::Sender<bool>,
    running: Vec<(&'static str, JoinHandle<()>)>,
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks {
            stop: watch::channel(false).0,
            running: Vec::new(),
        }
    }
}

impl Tasks {
    pub fn spawn<F, Fut>(&mut self, name: &'static str, task: F)
    where
        F: FnOnce(StopSignal) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let signal = StopSignal::new(self.stop.subscribe());
        self.running.push((name, tokio::spawn(task(signal))));
    }

    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Signals every task and waits for each (aborting one that does not finish in time).
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        for (name, handle) in self.running.drain(..) {
            let abort = handle.abort_handle();
            if tokio::time::timeout(STOP_GRACE, handle).await.is_err() {
                tracing::warn!(task = name, "background task did not stop in time; aborted");
                abort.abort();
            }
        }
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for (_, handle) in &self.running {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn stop_waits_for_tasks_that_listen() {
        let finished = Arc::new(AtomicBool::new(false));
        let mut tasks = Tasks::default();
        let flag = finished.clone();
        tasks.spawn("listener", |mut stop| async move {
            stop.stopped().await;
            flag.store(true, Ordering::SeqCst);
        });
        assert_eq!(tasks.len(), 1);
        tasks.stop().await;
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn dropping_the_owner_aborts_its_tasks() {
        let mut tasks = Tasks::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("forever", |_| async move {
            // Holds the sender until aborted; the receiver then sees it closed.
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        drop(tasks);
        assert!(tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .is_ok());
    }
}
