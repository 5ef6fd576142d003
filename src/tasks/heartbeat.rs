//! The node's heartbeat in the cluster: it keeps this node's lease, renews its control
//! locks, ends the sessions of nodes that died, and after a lapse of the bus checks this
//! node's sockets and sessions against the database.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::StopSignal;
use crate::cluster::Cluster;
use crate::relay::{EndReason, GrantScope, Kick, LoggedInWith};
use crate::state::SharedState;
use crate::store::StoreError;

/// After the bus was away (Redis down or restarted, or this node's subscription lost: Redis
/// closes a subscriber that falls too far behind), the cuts other nodes broadcast meanwhile
/// never arrived. The database has them: every robot and token socket here is checked
/// again (revoked, deleted, re-enrolled), then every session with an end here against its
/// grant (withdrawn, lowered; the robot's end too, since the owner's end notice may have
/// been lost the same way), and what no longer stands is closed or ended as the lost cut
/// would have done. A check that fails is tried again at the next beat.
async fn recheck_after_lapse(state: SharedState, cluster: Arc<Cluster>) {
    if let Err(e) = recheck_logins(&state).await {
        tracing::warn!(error = %e, "cannot check the logins after a bus lapse; retrying");
        cluster.mark_lapsed();
        return;
    }
    if let Err(e) = recheck_grants(&state).await {
        tracing::warn!(error = %e, "cannot check the grants after a bus lapse; retrying");
        cluster.mark_lapsed();
    }
}

async fn recheck_logins(state: &SharedState) -> Result<(), StoreError> {
    // Logins checked before this re-check and registered after it listed the sockets are
    // not in the list: counting a cut makes them check again.
    state.presence.note_access_cut();
    let mut closed = 0;
    for (conn, login) in state.presence.local_logins() {
        let (stands, reason) = match &login {
            LoggedInWith::Robot {
                robot_id,
                credentials,
            } => (
                state
                    .identity
                    .login_still_stands(robot_id, credentials)
                    .await?,
                Kick::Revoked,
            ),
            LoggedInWith::Token(token_id) => (
                !state.store.client_token_withdrawn(token_id).await?,
                Kick::TokenRevoked,
            ),
        };
        if !stands {
            state.presence.kick(&conn, reason);
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

async fn recheck_grants(state: &SharedState) -> Result<(), StoreError> {
    let mut ended = 0;
    for (robot_id, subject, role) in state.sessions.session_roles(GrantScope::EveryEndHere) {
        let (allowed, reason) = match state.store.grant(&robot_id, &subject).await? {
            Some(granted) if granted >= role => continue,
            Some(granted) => (Some(granted), EndReason::GrantChanged),
            None => (None, EndReason::GrantRevoked),
        };
        ended += state
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

/// Every third of the lease: renew the lease (writing presence again after a lapse),
/// renew control locks, probe the bus lag, and end what dead nodes left behind.
pub async fn heartbeat(state: SharedState, cluster: Arc<Cluster>, mut stop: StopSignal) {
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
        if state.is_shutting_down() {
            continue;
        }
        if let Err(e) = beat(&state, &cluster, &mut handled, &mut recheck, &mut renewed).await {
            tracing::debug!(error = %e, "cluster heartbeat failed");
        }
        if renewed.elapsed() < cluster.config().node_ttl {
            fenced = false;
        } else if !fenced && !database_answers(&state).await {
            fenced = true;
            tokio::spawn(fence(state.clone()));
        }
        state.sessions.sweep_remote();
    }
}

/// Whether the database answers within 2 s. A lapsed lease with the database still
/// answering is most likely Redis away for every node (nobody can take a lock then: new
/// driving sessions are refused everywhere), and this node keeps serving what it holds;
/// with the database gone too, this node is the one cut off, and it fences.
async fn database_answers(state: &SharedState) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(2), state.store.ping()).await,
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
async fn fence(state: SharedState) {
    let robots = state.presence.local_robots();
    let held = state.sessions.held_locks();
    tracing::error!(
        robots = robots.len(),
        locks = held.len(),
        "cannot renew this node's lease: fencing (closing its robots, ending its driving sessions)"
    );
    for (robot, _) in &robots {
        state.presence.kick_robot_here(robot, Kick::Shutdown);
    }
    for (robot, _) in held {
        state.sessions.preempt_here(&robot).await;
    }
}

async fn beat(
    state: &SharedState,
    cluster: &Arc<Cluster>,
    handled: &mut HashSet<String>,
    recheck: &mut Option<JoinHandle<()>>,
    renewed: &mut Instant,
) -> Result<(), crate::cluster::ClusterError> {
    let started = Instant::now();
    let lapsed = cluster.heartbeat().await?;
    *renewed = started;
    if lapsed {
        let robots = state.presence.local_robots();
        cluster.assert_presence(&robots).await?;
        tracing::info!(
            robots = robots.len(),
            "registered this node's presence in redis"
        );
        if recheck.as_ref().is_none_or(|task| task.is_finished()) {
            *recheck = Some(tokio::spawn(recheck_after_lapse(
                state.clone(),
                cluster.clone(),
            )));
        } else {
            // Still checking after an earlier lapse: check again once that one is done.
            cluster.mark_lapsed();
        }
    }
    let held = state.sessions.held_locks();
    for (robot, value) in cluster.renew_locks(&held, lapsed).await? {
        let ended = state.sessions.lock_lost(&robot, &value).await;
        tracing::error!(robot = %robot, ended, "control lock taken by another holder: its session here ended");
    }
    cluster.probe();
    let dead = cluster.dead_nodes(&state.sessions.remote_nodes()).await?;
    handled.retain(|node| dead.contains(node));
    for node in dead {
        if handled.contains(&node) {
            continue;
        }
        let ended = state.sessions.node_gone(&node).await;
        tracing::warn!(node = %node, ended, "node lost: its heartbeat lease expired");
        if cluster.claim_dead(&node).await? {
            cluster.node_lost();
            match state
                .store
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
