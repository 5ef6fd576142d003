//! What the relay's routing asks of sessions about the other nodes: sessions whose other
//! end is elsewhere (copies opened, refused and ended by their node, dead nodes), the
//! control locks held here, and the node's readiness and leave.

use super::{EndReason, Sessions};
use crate::delivery::{ConnId, Outbound};
use crate::relay::routing::MirrorSession;
use crate::relay::RelayError;
use crate::store::Store;

impl Sessions {
    /// Whether this node can reach the others (always, alone).
    pub async fn routing_ready(&self) -> Result<(), String> {
        self.hub.router.ready().await
    }

    /// Shutting down: the other nodes stop routing new sessions here.
    pub async fn leave_peers(&self) {
        self.hub.router.leave().await;
    }

    /// The database the session records are in (the node's lifecycle checks grants there).
    pub(in crate::relay) fn store(&self) -> &Store {
        &self.store
    }

    /// The control lock `value` of `robot_id` was found held by someone else (this node could
    /// not renew it in time, and another session took it): the session that held it here
    /// ends at once (`preempted`, both ends told), or the robot would have two controllers.
    /// Returns whether one ended.
    pub async fn lock_lost(&self, robot_id: &str, value: &str) -> bool {
        let Some(session_id) = self.hub.router.session_of_lock(robot_id, value) else {
            return false;
        };
        let ended = self.hub.end_one(&session_id, EndReason::Preempted.as_str());
        self.finish(&ended, EndReason::Preempted).await;
        !ended.is_empty()
    }

    /// The control locks to renew: (robot id, value).
    pub fn held_locks(&self) -> Vec<(String, String)> {
        self.hub.router.held_locks()
    }

    /// The robot's node learns from `origin` of a session opened there (see
    /// [`super::peers`]).
    pub(in crate::relay) fn open_mirror(&self, mirror: &MirrorSession) -> Result<(), RelayError> {
        self.hub.open_mirror(mirror)
    }

    /// The robot's node refused a session opened here (its id is another's there): it
    /// ends without a notice; returns the client's socket, to be told why.
    pub async fn refused_by_peer(&self, origin: &str, session_id: &str) -> Option<ConnId> {
        self.end_from_peer_with(origin, session_id, None).await
    }

    /// The node `origin` ended its side: end ours (record, lock), then tell the local end.
    pub async fn end_from_peer(&self, origin: &str, session_id: &str, notice: Option<String>) {
        self.end_from_peer_with(origin, session_id, notice).await;
    }

    async fn end_from_peer_with(
        &self,
        origin: &str,
        session_id: &str,
        notice: Option<String>,
    ) -> Option<ConnId> {
        let ended = self.hub.end_session_from_peer(session_id, origin, notice)?;
        if let Err(e) = self
            .store
            .end_session(&ended.record_id, EndReason::Closed.as_str())
            .await
        {
            tracing::error!(session = %session_id, error = %e, "cannot end session record now: kept, written once the database takes it");
        }
        self.release_locks(std::slice::from_ref(&ended)).await;
        // A client here hears of it now (a robot here already has).
        for (to, text) in &ended.notices {
            let _ = self
                .hub
                .router
                .deliver_here(None, to, Outbound::text(text.as_str()));
        }
        ended.local_end().cloned()
    }

    /// A node died: the sessions with an end there end (records first, then the local ends
    /// are told).
    pub async fn node_gone(&self, node: &str) -> usize {
        let ended = self
            .hub
            .end_sessions_with_node(node, EndReason::NodeDown.as_str());
        self.finish(&ended, EndReason::NodeDown).await;
        ended.len()
    }

    /// The other nodes that sessions here have an end on.
    pub fn remote_nodes(&self) -> Vec<String> {
        self.hub.router.remote_nodes()
    }

    /// Forgets sockets on other nodes that no session, live or in its grace period, names.
    pub fn sweep_remote(&self) {
        self.hub.sweep_remote();
    }
}
