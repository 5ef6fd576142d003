//! Cluster routing: local routing plus the other nodes through the cluster bus. The relay
//! speaks to it in its own terms ([`Cut`], [`MirrorSession`], sessions and locks); this is
//! where they become the cluster's messages. The node's life among the others runs on it
//! (`lifecycle.rs`, `peers.rs`, started by `workers.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::local::LocalRouter;
use super::terms::{Cut, MirrorSession, RemoteRobot};
use crate::cluster::{Cluster, ClusterConfig, ClusterError, Control, FrameOut, LockOutcome};
use crate::delivery::{ConnId, Outbound};
use crate::metrics::Metrics;
use crate::relay::table::EndedSession;
use crate::relay::{RelayError, SessionError};
use crate::store::{Role, StoreError};

/// A control lock this node holds in Redis for one of its sessions.
struct HeldLock {
    robot_id: String,
    value: String,
}

/// Local routing, and the other nodes through the cluster bus.
pub struct ClusterRouter {
    local: LocalRouter,
    cluster: Arc<Cluster>,
    /// Sockets on other nodes that sessions here talk to, and their node. Apart from the
    /// session table so that delivery takes only this small lock; swept once neither a
    /// session nor its grace period names them.
    remote: Mutex<HashMap<ConnId, Arc<str>>>,
    /// Control locks held for sessions owned here, by session id.
    locks: Mutex<HashMap<String, HeldLock>>,
    /// The node is shutting down: its heartbeat stops acting on what it holds.
    leaving: AtomicBool,
}

impl From<Cut> for Control {
    fn from(cut: Cut) -> Control {
        match cut {
            Cut::Robot { robot_id, reason } => Control::KickRobot { robot_id, reason },
            Cut::Credentials {
                credentials,
                reason,
            } => Control::KickCredentials {
                credentials,
                reason,
            },
            Cut::Token { token_id } => Control::KickToken { token_id },
            Cut::EmergencyStop { robot_id, subject } => {
                Control::EmergencyStop { robot_id, subject }
            }
            Cut::Preempt { robot_id } => Control::Preempt { robot_id },
            Cut::SessionsOf {
                robot_id,
                subject,
                allowed,
            } => Control::EndSessionsOf {
                robot_id,
                subject,
                allowed,
            },
        }
    }
}

/// The control lock cannot be checked: refuse the session (fail closed).
fn lock_unavailable(e: ClusterError) -> SessionError {
    tracing::error!(error = %e, "control lock unavailable");
    SessionError::Store(StoreError::Background(format!("control lock: {e}")))
}

impl ClusterRouter {
    pub(super) fn new(
        local: LocalRouter,
        config: ClusterConfig,
        metrics: &Metrics,
    ) -> Result<ClusterRouter, ClusterError> {
        Ok(ClusterRouter {
            local,
            cluster: Cluster::new(config, metrics.clone())?,
            remote: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            leaving: AtomicBool::new(false),
        })
    }

    pub(super) fn local(&self) -> &LocalRouter {
        &self.local
    }

    pub(super) fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    pub(super) fn remote(&self) -> MutexGuard<'_, HashMap<ConnId, Arc<str>>> {
        self.remote.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn locks(&self) -> MutexGuard<'_, HashMap<String, HeldLock>> {
        self.locks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::SeqCst)
    }

    /// Sends the frame to `to`'s node if `to` is on another one; else gives it back.
    pub(super) fn to_remote(
        &self,
        from: &ConnId,
        session_id: &str,
        to: &ConnId,
        message: Outbound,
    ) -> Option<Outbound> {
        let node = self.remote().get(to).cloned();
        let Some(node) = node else {
            return Some(message);
        };
        if let Outbound::Text(text) = message {
            let frame = FrameOut {
                from: Some(from.clone()),
                to: to.clone(),
                session: Arc::from(session_id),
                text,
            };
            self.cluster.send_frame(node, frame);
        }
        None
    }

    /// Tells the node of an ended session's other end (with the notice for its socket
    /// there, if it has one); returns the sockets told that way.
    pub(super) fn notify_remote(&self, session: &EndedSession) -> HashSet<ConnId> {
        let mut told = HashSet::new();
        let Some(node) = &session.remote else {
            return told;
        };
        for (to, text) in &session.notices {
            if self.remote().contains_key(to) {
                self.cluster.send(
                    node,
                    &Control::End {
                        session_id: session.session_id.clone(),
                        notice: Some(text.clone()),
                    },
                );
                told.insert(to.clone());
            }
        }
        if told.is_empty() {
            self.cluster.send(
                node,
                &Control::End {
                    session_id: session.session_id.clone(),
                    notice: None,
                },
            );
        }
        told
    }

    pub(super) fn announce(&self, cut: Cut) {
        self.cluster.broadcast(&Control::from(cut));
    }

    pub(super) fn open_remote(&self, node: &str, session: MirrorSession) {
        self.cluster.send(node, &Control::Open(session));
    }

    pub(super) fn presence_up(
        &self,
        robot_id: &str,
        conn: &ConnId,
    ) -> Option<oneshot::Receiver<()>> {
        self.cluster.presence_up(robot_id, conn)
    }

    pub(super) fn presence_down(&self, robot_id: &str, conn: &ConnId) {
        self.cluster.presence_down(robot_id, conn);
    }

    pub(super) async fn nodes_of(&self, ids: &[&str]) -> HashMap<String, String> {
        self.cluster.nodes_of(ids).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "robot presence on other nodes unknown");
            HashMap::new()
        })
    }

    pub(super) async fn locate(&self, robot_id: &str) -> Result<Option<RemoteRobot>, RelayError> {
        self.cluster.locate(robot_id).await.map_err(|e| {
            tracing::warn!(error = %e, "cannot locate robot on other nodes");
            RelayError::RobotOffline(robot_id.to_string())
        })
    }

    pub(super) async fn take_lock(
        &self,
        robot_id: &str,
        session_id: &str,
        subject: &str,
        role: Role,
    ) -> Result<(), SessionError> {
        match self
            .cluster
            .lock(robot_id, session_id, subject)
            .await
            .map_err(lock_unavailable)?
        {
            LockOutcome::Acquired(value) => {
                let lock = HeldLock {
                    robot_id: robot_id.to_string(),
                    value,
                };
                self.locks().insert(session_id.to_string(), lock);
                Ok(())
            }
            LockOutcome::Held { subject } => Err(RelayError::RobotBusy {
                robot_id: robot_id.to_string(),
                locked_by: (role == Role::Owner).then_some(subject),
            }
            .into()),
        }
    }

    /// Releases the control locks of these sessions (those it holds).
    pub(super) async fn release_locks(&self, sessions: impl Iterator<Item = &str>) {
        let released: Vec<HeldLock> = {
            let mut locks = self.locks();
            sessions.filter_map(|id| locks.remove(id)).collect()
        };
        for lock in released {
            if let Err(e) = self.cluster.unlock(&lock.robot_id, &lock.value).await {
                // It expires by itself within the lock's lifetime.
                tracing::warn!(robot = %lock.robot_id, error = %e, "cannot release control lock");
            }
        }
    }

    pub(super) fn session_of_lock(&self, robot_id: &str, value: &str) -> Option<String> {
        self.locks()
            .iter()
            .find(|(_, lock)| lock.robot_id == robot_id && lock.value == value)
            .map(|(session_id, _)| session_id.clone())
    }

    pub(super) fn held_locks(&self) -> Vec<(String, String)> {
        self.locks()
            .values()
            .map(|l| (l.robot_id.clone(), l.value.clone()))
            .collect()
    }

    pub(super) async fn ready(&self) -> Result<(), String> {
        if let Err(e) = self.cluster.ping().await {
            return Err(format!("redis: {e}"));
        }
        if !self.cluster.is_healthy() {
            return Err("redis: the cluster bus subscription is down".into());
        }
        Ok(())
    }

    pub(super) async fn leave(&self) {
        self.leaving.store(true, Ordering::SeqCst);
        // Peers stop routing new sessions here; what is open ends after, each end told.
        match self.cluster.leave().await {
            Ok(()) => tracing::info!("left the cluster: peers told"),
            Err(e) => tracing::warn!(error = %e, "cannot tell peers this node is leaving"),
        }
    }
}
