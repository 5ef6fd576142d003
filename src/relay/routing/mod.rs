//! The routing seam: how the relay reaches what is not in its own session table. Local
//! routing delivers to sockets on this node only. Cluster routing ([`cluster`]) wraps the
//! same local routing and adds what several nodes need: sockets on other nodes (their
//! frames and session ends cross the bus), the robot directory, cross-node cuts and the
//! control locks, and it owns the node's life among the others ([`lifecycle`]: lease, lock
//! renewal, dead nodes, the check after a lapse of the bus) and what the others tell it
//! ([`peers`]). The rest of the relay calls the router in relay terms and never asks
//! whether there is a cluster; only this folder names the cluster's own types.

mod cluster;
pub(super) mod lifecycle;
mod local;
mod peers;
mod terms;
pub(super) mod workers;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::table::EndedSession;
use super::RelayError;
use crate::cluster::{ClusterConfig, ClusterError};
use crate::delivery::{ConnId, DeliveryError, Kick, LocalBus, Mailbox, Outbound, Sender};
use crate::metrics::Metrics;
use crate::store::Role;
use cluster::ClusterRouter;
use local::LocalRouter;
pub use terms::{Cut, MirrorSession, PresenceWritten, RemoteRobot};

pub enum Router {
    Local(LocalRouter),
    Cluster(ClusterRouter),
}

impl Router {
    /// One node: delivery to its own sockets.
    pub fn local() -> Router {
        Router::Local(LocalRouter::new(Arc::new(LocalBus::default())))
    }

    /// Several nodes sharing a Redis. Nothing is sent yet: a node starts while Redis is
    /// away (it serves what is local and reports not ready until Redis answers).
    pub fn clustered(config: ClusterConfig, metrics: &Metrics) -> Result<Router, ClusterError> {
        let local = LocalRouter::new(Arc::new(LocalBus::default()));
        Ok(Router::Cluster(ClusterRouter::new(local, config, metrics)?))
    }

    fn here(&self) -> &LocalRouter {
        match self {
            Router::Local(local) => local,
            Router::Cluster(cluster) => cluster.local(),
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
        match self {
            Router::Local(_) => Some(message),
            Router::Cluster(c) => c.to_remote(from, session_id, to, message),
        }
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
            let told_elsewhere = match self {
                Router::Cluster(c) => c.notify_remote(session),
                Router::Local(_) => HashSet::new(),
            };
            for (to, text) in &session.notices {
                if !told_elsewhere.contains(to) {
                    let _ = self.deliver_here(None, to, Outbound::text(text.as_str()));
                }
            }
        }
    }

    /// Tells every other node of a cut, which each applies to its own sockets.
    pub fn announce(&self, cut: Cut) {
        if let Router::Cluster(c) = self {
            c.announce(cut);
        }
    }

    /// Tells the robot's node of a session opened here (its copy of the session).
    pub fn open_remote(&self, node: &str, session: MirrorSession) {
        if let Router::Cluster(c) = self {
            c.open_remote(node, session);
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
    pub fn presence_up(&self, robot_id: &str, conn: &ConnId) -> Option<PresenceWritten> {
        match self {
            Router::Local(_) => None,
            Router::Cluster(c) => c.presence_up(robot_id, conn).map(PresenceWritten),
        }
    }

    pub fn presence_down(&self, robot_id: &str, conn: &ConnId) {
        if let Router::Cluster(c) = self {
            c.presence_down(robot_id, conn);
        }
    }

    /// The nodes of these robots that are connected to other nodes (none without a
    /// cluster; an unreachable directory is logged and reads as none).
    pub async fn nodes_of(&self, ids: &[&str]) -> HashMap<String, String> {
        match self {
            Router::Local(_) => HashMap::new(),
            Router::Cluster(c) => c.nodes_of(ids).await,
        }
    }

    /// The robot's socket on another node, if it is connected to one.
    pub async fn locate(&self, robot_id: &str) -> Result<Option<RemoteRobot>, RelayError> {
        match self {
            Router::Local(_) => Ok(None),
            Router::Cluster(c) => c.locate(robot_id).await,
        }
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
        match self {
            Router::Cluster(c) if role.may_drive() => {
                c.take_lock(robot_id, session_id, subject, role).await
            }
            _ => Ok(()),
        }
    }

    /// Releases the control locks of ended sessions.
    pub async fn release_locks(&self, ended: &[EndedSession]) {
        if let Router::Cluster(c) = self {
            c.release_locks(ended.iter().map(|e| e.session_id.as_str()))
                .await;
        }
    }

    /// Releases the control lock taken for `session_id`, if any: a session that ended while
    /// its opener was taking the lock (nobody else could release it).
    pub async fn release_lock_of(&self, session_id: &str) {
        if let Router::Cluster(c) = self {
            c.release_locks(std::iter::once(session_id)).await;
        }
    }

    /// The session that held the control lock `value` of `robot_id`.
    pub fn session_of_lock(&self, robot_id: &str, value: &str) -> Option<String> {
        match self {
            Router::Local(_) => None,
            Router::Cluster(c) => c.session_of_lock(robot_id, value),
        }
    }

    /// The locks to renew: (robot id, value). Every path that ends a session releases its
    /// lock (and takes it out of this map) before anyone hears of the end.
    pub fn held_locks(&self) -> Vec<(String, String)> {
        match self {
            Router::Local(_) => Vec::new(),
            Router::Cluster(c) => c.held_locks(),
        }
    }

    /// Whether this node can reach the others (always, alone). Not ready means: take it
    /// out of the load balancer's rotation; it keeps serving the sockets it has.
    pub async fn ready(&self) -> Result<(), String> {
        match self {
            Router::Local(_) => Ok(()),
            Router::Cluster(c) => c.ready().await,
        }
    }

    /// Shutting down: the other nodes stop routing new sessions here, and the node's own
    /// background work stops acting (what is open ends through [`Sessions::end_all`]).
    pub async fn leave(&self) {
        if let Router::Cluster(c) = self {
            c.leave().await;
        }
    }
}
