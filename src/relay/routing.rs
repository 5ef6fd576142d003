//! The routing seam: how the relay reaches what is not in its own session table. Local
//! routing delivers to sockets on this node only. Cluster routing wraps the same local
//! routing and adds what several nodes need: sockets on other nodes (their frames and
//! session ends cross the bus), the robot directory, cross-node kicks and the control
//! locks. The rest of the relay calls the router and never asks whether there is a cluster.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::table::EndedSession;
use super::RelayError;
use crate::cluster::{Cluster, ClusterError, Control, FrameOut, LockOutcome, RemoteRobot};
use crate::delivery::{Bus, ConnId, DeliveryError, Kick, Mailbox, Outbound, Sender};
use crate::store::Role;

/// Delivery to the sockets of this node.
pub struct LocalRouter {
    bus: Arc<dyn Bus>,
}

impl LocalRouter {
    pub fn new(bus: Arc<dyn Bus>) -> LocalRouter {
        LocalRouter { bus }
    }

    /// Queues a frame for a socket here. A receiver whose whole queue is full is closed
    /// instead of growing memory; a sender over its share is refused, the receiver left
    /// alone.
    fn deliver(
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
}

impl ClusterRouter {
    fn remote(&self) -> MutexGuard<'_, HashMap<ConnId, Arc<str>>> {
        self.remote.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn locks(&self) -> MutexGuard<'_, HashMap<String, HeldLock>> {
        self.locks.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn unlock_all(&self, released: impl IntoIterator<Item = HeldLock>) {
        for lock in released {
            if let Err(e) = self.cluster.unlock(&lock.robot_id, &lock.value).await {
                // It expires by itself within the lock's lifetime.
                tracing::warn!(robot = %lock.robot_id, error = %e, "cannot release control lock");
            }
        }
    }
}

pub enum Router {
    Local(LocalRouter),
    Cluster(ClusterRouter),
}

/// The control lock cannot be checked: refuse the session (fail closed).
fn lock_unavailable(e: ClusterError) -> super::SessionError {
    tracing::error!(error = %e, "control lock unavailable");
    super::SessionError::Store(crate::store::StoreError::Background(format!(
        "control lock: {e}"
    )))
}

impl Router {
    pub fn local(bus: Arc<dyn Bus>) -> Router {
        Router::Local(LocalRouter::new(bus))
    }

    pub fn clustered(bus: Arc<dyn Bus>, cluster: Arc<Cluster>) -> Router {
        Router::Cluster(ClusterRouter {
            local: LocalRouter::new(bus),
            cluster,
            remote: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
        })
    }

    fn here(&self) -> &LocalRouter {
        match self {
            Router::Local(local) => local,
            Router::Cluster(cluster) => &cluster.local,
        }
    }

    pub fn attach(&self, conn: ConnId, mailbox: Mailbox) {
        self.here().bus.attach(conn, mailbox);
    }

    pub fn detach(&self, conn: &ConnId) {
        self.here().bus.detach(conn);
    }

    /// Closes a socket of this node.
    pub fn kick_here(&self, conn: &ConnId, reason: Kick) {
        self.here().bus.kick(conn, reason);
    }

    /// A frame of `conn` was refused: a strike against it.
    pub fn strike(&self, conn: &ConnId) {
        self.here().bus.strike(conn);
    }

    /// Queues a frame from `from` about `session_id` for `to`, here or on its node. The
    /// receiving node applies the receiver's queue limits; a sender over its share there is
    /// told `relay_throttled` through its node.
    pub fn deliver(
        &self,
        from: &ConnId,
        share: Sender<'_>,
        session_id: &str,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        match self.to_remote(from, session_id, to, message) {
            Some(message) => self.here().deliver(Some(share), to, message),
            None => Ok(()),
        }
    }

    /// An emergency stop within a session: as [`Router::deliver`], but queued here as the
    /// server's own frame, past every sender's share and rate (a stop never waits behind a
    /// flood, its sender's own included). A full queue refuses it without closing the
    /// receiver: a flood of stops must not cut the robot off.
    pub fn deliver_stop(
        &self,
        from: &ConnId,
        session_id: &str,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        match self.to_remote(from, session_id, to, message) {
            Some(message) => self.here().bus.deliver(None, to, message),
            None => Ok(()),
        }
    }

    /// Sends the frame to `to`'s node if `to` is on another one; else gives it back.
    fn to_remote(
        &self,
        from: &ConnId,
        session_id: &str,
        to: &ConnId,
        message: Outbound,
    ) -> Option<Outbound> {
        if let Router::Cluster(c) = self {
            let node = c.remote().get(to).cloned();
            if let Some(node) = node {
                if let Outbound::Text(text) = message {
                    let frame = FrameOut {
                        from: Some(from.clone()),
                        to: to.clone(),
                        session: Arc::from(session_id),
                        text,
                    };
                    c.cluster.send_frame(node, frame);
                }
                return None;
            }
        }
        Some(message)
    }

    /// Delivery to a socket of this node only (notices, frames that came from another node).
    pub fn deliver_here(
        &self,
        from: Option<Sender<'_>>,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        self.here().deliver(from, to, message)
    }

    /// Tells the remaining ends of ended sessions. An end on another node hears of it
    /// through that node, which ends its copy of the session first.
    pub fn notify(&self, ended: &[EndedSession]) {
        for session in ended {
            let mut remote_told = false;
            for (to, text) in &session.notices {
                match (&session.remote, self) {
                    (Some(node), Router::Cluster(c)) if c.remote().contains_key(to) => {
                        c.cluster.send(
                            node,
                            &Control::End {
                                session_id: session.session_id.clone(),
                                notice: Some(text.clone()),
                            },
                        );
                        remote_told = true;
                    }
                    _ => {
                        let _ = self.deliver_here(None, to, Outbound::text(text.as_str()));
                    }
                }
            }
            if let (Some(node), Router::Cluster(c), false) = (&session.remote, self, remote_told) {
                c.cluster.send(
                    node,
                    &Control::End {
                        session_id: session.session_id.clone(),
                        notice: None,
                    },
                );
            }
        }
    }

    /// Tells every other node of a cut (a kick by robot, token or credential, a grant
    /// change), which each applies to its own sockets.
    pub fn announce(&self, control: &Control) {
        if let Router::Cluster(c) = self {
            c.cluster.broadcast(control);
        }
    }

    /// Tells one node.
    pub fn tell(&self, node: &str, control: &Control) {
        if let Router::Cluster(c) = self {
            c.cluster.send(node, control);
        }
    }

    /// The node of a socket on another node that a session here names.
    pub fn remote_node(&self, conn: &ConnId) -> Option<Arc<str>> {
        match self {
            // Single node: no lookup at all on the relay path.
            Router::Local(_) => None,
            Router::Cluster(c) => c.remote().get(conn).cloned(),
        }
    }

    /// A session here names `conn`, a socket on `node`.
    pub fn add_remote(&self, conn: ConnId, node: Arc<str>) {
        if let Router::Cluster(c) = self {
            c.remote().insert(conn, node);
        }
    }

    /// The other nodes that sessions here have an end on.
    pub fn remote_nodes(&self) -> Vec<String> {
        let Router::Cluster(c) = self else {
            return Vec::new();
        };
        let mut nodes: Vec<String> = c.remote().values().map(|n| n.to_string()).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// `node` died: its sockets are forgotten.
    pub fn forget_node(&self, node: &str) {
        if let Router::Cluster(c) = self {
            c.remote().retain(|_, n| &**n != node);
        }
    }

    /// Forgets the remote sockets `named` does not list.
    pub fn retain_remote(&self, named: &HashSet<ConnId>) {
        if let Router::Cluster(c) = self {
            c.remote().retain(|conn, _| named.contains(conn));
        }
    }

    pub fn is_clustered(&self) -> bool {
        matches!(self, Router::Cluster(_))
    }

    /// A robot came online here. In a cluster, resolves once every node can find it.
    pub fn presence_up(&self, robot_id: &str, conn: &ConnId) -> Option<oneshot::Receiver<()>> {
        match self {
            Router::Local(_) => None,
            Router::Cluster(c) => c.cluster.presence_up(robot_id, conn),
        }
    }

    pub fn presence_down(&self, robot_id: &str, conn: &ConnId) {
        if let Router::Cluster(c) = self {
            c.cluster.presence_down(robot_id, conn);
        }
    }

    /// The nodes of these robots that are connected to other nodes (none without a
    /// cluster; an unreachable directory is logged and reads as none).
    pub async fn nodes_of(&self, ids: &[&str]) -> HashMap<String, String> {
        let Router::Cluster(c) = self else {
            return HashMap::new();
        };
        c.cluster.nodes_of(ids).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "robot presence on other nodes unknown");
            HashMap::new()
        })
    }

    /// The robot's socket on another node, if it is connected to one.
    pub async fn locate(&self, robot_id: &str) -> Result<Option<RemoteRobot>, RelayError> {
        let Router::Cluster(c) = self else {
            return Ok(None);
        };
        c.cluster.locate(robot_id).await.map_err(|e| {
            tracing::warn!(error = %e, "cannot locate robot on other nodes");
            RelayError::RobotOffline(robot_id.to_string())
        })
    }

    /// A driving session takes the robot's cluster-wide control lock (the session table
    /// already checked this node's sessions). Local routing has nothing more to check.
    pub async fn take_lock(
        &self,
        robot_id: &str,
        session_id: &str,
        subject: &str,
        role: Role,
    ) -> Result<(), super::SessionError> {
        let Router::Cluster(c) = self else {
            return Ok(());
        };
        if !role.may_drive() {
            return Ok(());
        }
        match c
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
                c.locks().insert(session_id.to_string(), lock);
                Ok(())
            }
            LockOutcome::Held { subject } => Err(RelayError::RobotBusy {
                robot_id: robot_id.to_string(),
                locked_by: (role == Role::Owner).then_some(subject),
            }
            .into()),
        }
    }

    /// Releases the control locks of ended sessions.
    pub async fn release_locks(&self, ended: &[EndedSession]) {
        let Router::Cluster(c) = self else {
            return;
        };
        let released: Vec<HeldLock> = {
            let mut locks = c.locks();
            ended
                .iter()
                .filter_map(|e| locks.remove(&e.session_id))
                .collect()
        };
        c.unlock_all(released).await;
    }

    /// Releases the control lock taken for `session_id`, if any: a session that ended while
    /// its opener was taking the lock (nobody else could release it).
    pub async fn release_lock_of(&self, session_id: &str) {
        let Router::Cluster(c) = self else {
            return;
        };
        let released = c.locks().remove(session_id);
        c.unlock_all(released).await;
    }

    /// The session that held the control lock `value` of `robot_id`.
    pub fn session_of_lock(&self, robot_id: &str, value: &str) -> Option<String> {
        let Router::Cluster(c) = self else {
            return None;
        };
        c.locks()
            .iter()
            .find(|(_, lock)| lock.robot_id == robot_id && lock.value == value)
            .map(|(session_id, _)| session_id.clone())
    }

    /// The locks to renew: (robot id, value). Every path that ends a session releases its
    /// lock (and takes it out of this map) before anyone hears of the end.
    pub fn held_locks(&self) -> Vec<(String, String)> {
        let Router::Cluster(c) = self else {
            return Vec::new();
        };
        c.locks()
            .values()
            .map(|l| (l.robot_id.clone(), l.value.clone()))
            .collect()
    }
}
