//! The node's side of the cluster: one subscription that hands other nodes' messages to the
//! relay, and the heartbeat that keeps this node's lease, renews its control locks and ends
//! the sessions of nodes that died.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use tokio::task::JoinHandle;

use super::StopSignal;
use crate::cluster::message::{frame_id, Refusal};
use crate::cluster::{Cluster, Control, PeerMessage, RelayedFrame};
use crate::messages;
use crate::relay::{
    ConnId, DeliveryError, EndReason, GrantScope, Kick, LoggedInWith, Outbound, RelayError,
};
use crate::state::SharedState;
use crate::store::StoreError;
use crate::ws::WsError;

/// Longest wait between two attempts to subscribe again while Redis is away.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Receives what other nodes send to this one, resubscribing after Redis comes back.
pub async fn listen(state: SharedState, cluster: Arc<Cluster>, mut stop: StopSignal) {
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
                        Ok(Ok(message)) => handle(&state, &cluster, message).await,
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

async fn handle(state: &SharedState, cluster: &Cluster, message: PeerMessage) {
    let (origin, control) = match message {
        PeerMessage::Frames(frames) => {
            for frame in frames {
                deliver_frame(state, cluster, frame);
            }
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
        Control::Open(mirror) => state.sessions.open_mirror(&origin, mirror),
        Control::End { session_id, notice } => {
            state
                .sessions
                .end_from_peer(&origin, &session_id, notice)
                .await
        }
        Control::Refused {
            session_id,
            robot_id,
            offer_id,
            reason,
        } => {
            if let Some(client) = state.sessions.refused_by_peer(&origin, &session_id).await {
                let error = match reason {
                    Refusal::ConnectionIdInUse => RelayError::ConnectionIdInUse(session_id),
                    Refusal::TooManyViewers(per) => RelayError::TooManyViewers { robot_id, per },
                };
                tell(state, &client, &WsError::Relay(error), offer_id.as_deref());
            }
        }
        Control::Kick { conn, reason } => state.hub.kick(&conn.into(), reason),
        Control::KickRobot { robot_id, reason } => {
            state.hub.kick_robot_here(&robot_id, reason);
        }
        Control::KickToken { token_id } => {
            state.hub.kick_token_here(&token_id);
        }
        Control::KickCredentials {
            credentials,
            reason,
        } => {
            state.hub.kick_credentials_here(&credentials, reason);
        }
        Control::EndSessionsOf {
            robot_id,
            subject,
            allowed,
        } => {
            let reason = if allowed.is_some() {
                EndReason::GrantChanged
            } else {
                EndReason::GrantRevoked
            };
            if let Err(e) = state
                .sessions
                .end_for_subject_here(&robot_id, &subject, allowed, reason, GrantScope::Owned)
                .await
            {
                tracing::error!(error = %e, "cannot end sessions after a grant change");
            }
        }
        Control::NodeLeaving => {
            tracing::info!(node = %origin, "a node is draining; its robots will reconnect elsewhere")
        }
        Control::Probe { sent_unix_ms } => cluster.observe_probe(sent_unix_ms),
        Control::Throttled { conn, id } => {
            let conn = ConnId::from(conn);
            tell(state, &conn, &WsError::Throttled, id.as_deref());
            // As here (ws::connection): a robot is not struck for a client that stalls.
            if !state.hub.is_robot(&conn) {
                state.hub.strike(&conn);
            }
        }
    }
}

/// Tells a socket here of an error another node found with its message `id`: the same
/// error a local refusal earns (ws::protocol).
fn tell(state: &SharedState, conn: &ConnId, error: &WsError, id: Option<&str>) {
    let code = error.code();
    state
        .metrics
        .errors
        .with_label_values(&[code.as_str()])
        .inc();
    let text = messages::error(code, &error.to_string(), error.details(), id);
    let _ = state.hub.deliver_local(None, conn, Outbound::text(text));
}

/// Delivers a frame relayed from another node to its socket here, with every rule of a
/// local delivery; a sender over its share is told by its own node.
fn deliver_frame(state: &SharedState, cluster: &Cluster, frame: RelayedFrame) {
    cluster.count_received_frame();
    let RelayedFrame {
        from,
        to,
        session,
        text,
    } = frame;
    // The sending node routed it by its own table; this node checks it against its own,
    // so a session id taken over elsewhere reaches nobody here.
    let admitted = from
        .as_ref()
        .and_then(|from| state.hub.admits_frame(from, &session, &to));
    let Some(share) = admitted else {
        state.metrics.cluster_frames_refused.inc();
        tracing::debug!(session = %session, "frame from another node outside any session of its ends dropped");
        return;
    };
    // Shared bytes: the copy kept for a refusal is a reference count.
    let text = Utf8Bytes::from(text);
    let delivered =
        state
            .hub
            .deliver_local(Some(share.sender()), &to, Outbound::Text(text.clone()));
    if let (Err(DeliveryError::SenderThrottled), Some(from)) = (delivered, from) {
        if let Some(node) = state.hub.remote_node(&from) {
            cluster.send(
                &node,
                &Control::Throttled {
                    conn: from.to_string(),
                    id: frame_id(text.as_str()),
                },
            );
        }
    }
}

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
    state.hub.note_access_cut();
    let mut closed = 0;
    for (conn, login) in state.hub.local_logins() {
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
            state.hub.kick(&conn, reason);
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
    for (robot_id, subject, role) in state.hub.session_roles(GrantScope::EveryEndHere) {
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
    loop {
        tokio::select! {
            _ = stop.stopped() => return,
            _ = tick.tick() => {}
        }
        if state.is_shutting_down() {
            continue;
        }
        if let Err(e) = beat(&state, &cluster, &mut handled, &mut recheck).await {
            tracing::debug!(error = %e, "cluster heartbeat failed");
        }
        state.hub.sweep_remote();
    }
}

async fn beat(
    state: &SharedState,
    cluster: &Arc<Cluster>,
    handled: &mut HashSet<String>,
    recheck: &mut Option<JoinHandle<()>>,
) -> Result<(), crate::cluster::ClusterError> {
    let lapsed = cluster.heartbeat().await?;
    if lapsed {
        let robots = state.hub.local_robots();
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
    for robot in cluster.renew_locks(&held, lapsed).await? {
        tracing::error!(robot = %robot, "control lock taken by another holder");
    }
    cluster.probe();
    let dead = cluster.dead_nodes(&state.hub.remote_nodes()).await?;
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
