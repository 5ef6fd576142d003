//! The node's life in the cluster, owned by cluster routing: its heartbeat keeps this
//! node's lease, renews its control locks, ends the sessions of nodes that died, fences the
//! node when it is cut off, and after a lapse of the bus checks this node's sockets and
//! sessions against the database.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::Router;
use crate::cluster::{Cluster, ClusterError};
use crate::relay::{EndReason, GrantScope, Kick, LoggedInWith, Presence, Sessions};
use crate::shutdown::StopSignal;
use crate::store::StoreError;

/// Whether the logins of this node's sockets still stand, by the database (checked again
/// after the bus was away, when the broadcast of a cut may have been lost). The server
/// provides it: identity and client tokens live outside the relay.
pub trait LoginCheck: Send + Sync + 'static {
    fn still_stands<'a>(
        &'a self,
        login: &'a LoggedInWith,
    ) -> Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send + 'a>>;
}

/// What the heartbeat acts on: the relay's two doors and the check of logins.
#[derive(Clone)]
pub struct Node {
    presence: Presence,
    sessions: Sessions,
    logins: Arc<dyn LoginCheck>,
}

/// After the bus was away (Redis down or restarted, or this node's subscription lost: Redis
/// closes a subscriber that falls too far behind), the cuts other nodes broadcast meanwhile
/// never arrived. The database has them: every robot and token socket here is checked
/// again (revoked, deleted, re-enrolled), then every session with an end here against its
/// grant (withdrawn, lowered; the robot's end too, since the owner's end notice may have
/// been lost the same way), and what no longer stands is closed or ended as the lost cut
/// would have done. A check that fails is tried again at the next beat.
async fn recheck_after_lapse(node: Node, cluster: Arc<Cluster>) {
    if let Err(e) = recheck_logins(&node).await {
        tracing::warn!(error = %e, "cannot check the logins after a bus lapse; retrying");
        cluster.mark_lapsed();
        return;
    }
    if let Err(e) = recheck_grants(&node).await {
        tracing::warn!(error = %e, "cannot check the grants after a bus lapse; retrying");
        cluster.mark_lapsed();
    }
}

async fn recheck_logins(node: &Node) -> Result<(), StoreError> {
    // Logins checked before this re-check and registered after it listed the sockets are
    // not in the list: counting a cut makes them check again.
    node.presence.note_access_cut();
    let mut closed = 0;
    for (conn, login) in node.presence.local_logins() {
        let reason = match &login {
            LoggedInWith::Robot { .. } => Kick::Revoked,
            LoggedInWith::Token(_) => Kick::TokenRevoked,
        };
        let stands = node.logins.still_stands(&login).await?;
        if !stands {
            node.presence.kick(&conn, reason);
            closed += 1;
        }
    }
    if closed > 0 {
        tracing::warn!(
            closed,
            "closed sockets whose credential was withdrawn while the bus was away"
        );
    }
    Ok(())
}

async fn recheck_grants(node: &Node) -> Result<(), StoreError> {
    let mut ended = 0;
    for (robot_id, subject, role) in node.sessions.session_roles(GrantScope::EveryEndHere) {
        let (allowed, reason) = match node.sessions.store().grant(&robot_id, &subject).await? {
            Some(granted) if granted >= role => continue,
            Some(granted) => (Some(granted), EndReason::GrantChanged),
            None => (None, EndReason::GrantRevoked),
        };
        ended += node
            .sessions
            .end_for_subject_here(
                &robot_id,
                &subject,
                allowed,
                reason,
                GrantScope::EveryEndHere,
            )
            .await?;
    }
    if ended > 0 {
        tracing::warn!(
            ended,
            "ended sessions whose grant was withdrawn or lowered while the bus was away"
        );
    }
    Ok(())
}

impl Node {
    pub fn new(presence: &Presence, sessions: &Sessions, logins: Arc<dyn LoginCheck>) -> Node {
        Node {
            presence: presence.clone(),
            sessions: sessions.clone(),
            logins,
        }
    }

    /// Whether the node is leaving (shutting down): its heartbeat stops acting then.
    fn is_leaving(&self) -> bool {
        match &self.sessions.hub().router {
            Router::Cluster(c) => c.is_leaving(),
            Router::Local(_) => true,
        }
    }

    /// Every third of the lease: renew the lease (writing presence again after a lapse),
    /// renew control locks, probe the bus lag, and end what dead nodes left behind.
    pub async fn heartbeat(self, mut stop: StopSignal) {
        let Router::Cluster(c) = &self.sessions.hub().router else {
            return;
        };
        let cluster = c.cluster().clone();
        let node = self;
        // Not fatal: the node serves what is local and reports not ready until Redis answers.
        if let Err(e) = cluster.ping().await {
            tracing::error!(error = %e, "redis does not answer at start; retrying in the background");
        }
        let period = (cluster.config().node_ttl / 3).max(Duration::from_millis(200));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Dead nodes already handled here, until they come back.
        let mut handled: HashSet<String> = HashSet::new();
        // The check of this node's sockets after a lapse, while it runs.
        let mut recheck = None;
        // When the last beat that renewed the lease started: the lease runs out `node_ttl` later.
        let mut renewed = Instant::now();
        let mut fenced = false;
        loop {
            tokio::select! {
                _ = stop.stopped() => return,
                _ = tick.tick() => {}
            }
            if node.is_leaving() {
                continue;
            }
            if let Err(e) = beat(&node, &cluster, &mut handled, &mut recheck, &mut renewed).await {
                tracing::debug!(error = %e, "cluster heartbeat failed");
            }
            if renewed.elapsed() < cluster.config().node_ttl {
                fenced = false;
            } else if !fenced && !database_answers(&node).await {
                fenced = true;
                tokio::spawn(fence(node.clone()));
            }
            node.sessions.sweep_remote();
        }
    }
}

/// Whether the database answers within 2 s. A lapsed lease with the database still
/// answering is most likely Redis away for every node (nobody can take a lock then: new
/// driving sessions are refused everywhere), and this node keeps serving what it holds;
/// with the database gone too, this node is the one cut off, and it fences.
async fn database_answers(node: &Node) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(2), node.sessions.store().ping()).await,
        Ok(Ok(()))
    )
}

/// This node could not renew its lease for `node_ttl` nor reach the database: the others
/// count it dead, its control locks have run out and its robots read offline elsewhere.
/// It stops acting on what it can no longer hold: its robots are closed (1001; they
/// reconnect through the load balancer to a node that is whole, as /readyz steers them)
/// and its driving sessions end, so no robot can end up with a controller here and another
/// elsewhere. Its own task: the ends write records the database may not take, and the
/// heartbeat must keep beating.
async fn fence(node: Node) {
    let robots = node.presence.local_robots();
    let held = node.sessions.held_locks();
    tracing::error!(
        robots = robots.len(),
        locks = held.len(),
        "cannot renew this node's lease: fencing (closing its robots, ending its driving sessions)"
    );
    for (robot, _) in &robots {
        node.presence.kick_robot_here(robot, Kick::Shutdown);
    }
    for (robot, _) in held {
        node.sessions.preempt_here(&robot).await;
    }
}

async fn beat(
    here: &Node,
    cluster: &Arc<Cluster>,
    handled: &mut HashSet<String>,
    recheck: &mut Option<JoinHandle<()>>,
    renewed: &mut Instant,
) -> Result<(), ClusterError> {
    let started = Instant::now();
    let lapsed = cluster.heartbeat().await?;
    *renewed = started;
    if lapsed {
        let robots = here.presence.local_robots();
        cluster.assert_presence(&robots).await?;
        tracing::info!(
            robots = robots.len(),
            "registered this node's presence in redis"
        );
        if recheck.as_ref().is_none_or(|task| task.is_finished()) {
            *recheck = Some(tokio::spawn(recheck_after_lapse(
                here.clone(),
                cluster.clone(),
            )));
        } else {
            // Still checking after an earlier lapse: check again once that one is done.
            cluster.mark_lapsed();
        }
    }
    let held = here.sessions.held_locks();
    for (robot, value) in cluster.renew_locks(&held, lapsed).await? {
        // Not renewed: another holder took it, or (the usual case on a busy node) the
        // session released it between the snapshot above and the renewal, and a new session
        // took the robot. Only the first ends anything here.
        if here.sessions.lock_lost(&robot, &value).await {
            tracing::error!(robot = %robot, "control lock taken by another holder: its session here ended");
        } else {
            tracing::debug!(robot = %robot, "control lock released while being renewed: nothing to end");
        }
    }
    cluster.probe();
    let dead = cluster.dead_nodes(&here.sessions.remote_nodes()).await?;
    handled.retain(|node| dead.contains(node));
    for node in dead {
        if handled.contains(&node) {
            continue;
        }
        let ended = here.sessions.node_gone(&node).await;
        tracing::warn!(node = %node, ended, "node lost: its heartbeat lease expired");
        if cluster.claim_dead(&node).await? {
            cluster.node_lost();
            match here
                .sessions
                .store()
                .end_open_sessions(&node, EndReason::NodeDown.as_str())
                .await
            {
                Ok(n) => {
                    tracing::warn!(node = %node, records = n, "ended the lost node's session records")
                }
                Err(e) => {
                    tracing::error!(node = %node, error = %e, "cannot end the lost node's session records")
                }
            }
        }
        handled.insert(node);
    }
    Ok(())
}
