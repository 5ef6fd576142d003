//! How sessions end: one at a time, by the dozen (a grant withdrawn, a node lost, shutdown)
//! or with their socket; the grace period in which an ended session's ends may still
//! mention it, and sessions waiting for their client to come back.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::{ConnEntry, ConnKind, Ended, GrantScope, Session, State};
use crate::delivery::ConnId;
use crate::messages;
use crate::store::Role;

/// A session that ended: its record must be closed, then `notices` delivered by the router
/// (in that order, so whoever hears of the end finds the record ended). The robot's notice,
/// when the robot is here, is taken out and delivered at once (see `Hub::tell_robots_now`).
#[derive(Debug, Clone)]
pub struct EndedSession {
    pub session_id: String,
    pub record_id: String,
    pub(in crate::relay) notices: Vec<(ConnId, String)>,
    /// The other end's node, to be told (None: local, or the other node told us).
    pub(in crate::relay) remote: Option<Arc<str>>,
    /// The end on this node, when the other is on another node.
    local_end: Option<ConnId>,
    pub(in crate::relay) robot_conn: ConnId,
}

impl EndedSession {
    /// The end of a two-node session that is on this node.
    pub fn local_end(&self) -> Option<&ConnId> {
        self.local_end.as_ref()
    }

    fn of(session_id: String, session: Session, notices: Vec<(ConnId, String)>) -> Self {
        EndedSession {
            session_id,
            record_id: session.record_id.to_string(),
            notices,
            local_end: local_end(&session),
            robot_conn: session.robot_conn.clone(),
            remote: session.remote,
        }
    }
}

impl State {
    /// Ends a session without notices if it passes `check`.
    pub(in crate::relay) fn end_where(
        &mut self,
        session_id: &str,
        check: impl FnOnce(&Session) -> bool,
    ) -> Option<EndedSession> {
        self.prune_ended(Instant::now());
        if !check(self.sessions.get(session_id)?) {
            return None;
        }
        let session = self.remove_session(session_id)?;
        Some(EndedSession::of(
            session_id.to_string(),
            session,
            Vec::new(),
        ))
    }

    /// Ends the sessions of `ids`, with a notice to both ends of each.
    fn end_both_ways(&mut self, ids: Vec<String>, cause: &str) -> Vec<EndedSession> {
        ids.into_iter()
            .filter_map(|id| {
                let session = self.remove_session(&id)?;
                let text = messages::disconnected(&id, Some(cause));
                let notices = vec![
                    (session.client_conn.clone(), text.clone()),
                    (session.robot_conn.clone(), text),
                ];
                Some(EndedSession::of(id, session, notices))
            })
            .collect()
    }

    /// Ends the sessions whose other end was on `node`; both local ends are to be told,
    /// nobody there.
    pub(in crate::relay) fn end_with_node(&mut self, node: &str, cause: &str) -> Vec<EndedSession> {
        let ids = self.ids_where(|s| s.remote.as_deref() == Some(node));
        let mut ended = self.end_both_ways(ids, cause);
        for session in &mut ended {
            session.remote = None;
        }
        ended
    }

    /// Ends the sessions `subject` has with `robot_id` in `scope` whose role is above
    /// `allowed` (all of them when None).
    pub(in crate::relay) fn end_of_subject(
        &mut self,
        robot_id: &str,
        subject: &str,
        allowed: Option<Role>,
        cause: &str,
        scope: GrantScope,
    ) -> Vec<EndedSession> {
        let ids = self.ids_where(|s| {
            scope.covers(s)
                && s.robot_id == robot_id
                && &*s.subject == subject
                && allowed.is_none_or(|role| s.role > role)
        });
        self.end_both_ways(ids, cause)
    }

    /// Ends the driving sessions with `robot_id`, mirrors too (ending a mirror tells its
    /// owner); both ends are to be told.
    pub(in crate::relay) fn end_driving(
        &mut self,
        robot_id: &str,
        cause: &str,
    ) -> Vec<EndedSession> {
        let ids = self.ids_where(|s| s.robot_id == robot_id && s.role.may_drive());
        self.end_both_ways(ids, cause)
    }

    /// Ends one session, with a notice to both ends.
    pub(in crate::relay) fn end_one(&mut self, session_id: &str, cause: &str) -> Vec<EndedSession> {
        self.end_both_ways(vec![session_id.to_string()], cause)
    }

    pub(in crate::relay) fn end_all(&mut self, cause: &str) -> Vec<EndedSession> {
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        self.end_both_ways(ids, cause)
    }

    /// Sessions whose client went away longer ago than the resume window: they end now,
    /// the robot's end to be told.
    pub(in crate::relay) fn expire_orphans(&mut self, now: Instant) -> Vec<EndedSession> {
        let resume = self.limits.resume;
        let expired = self.ids_where(|s| {
            s.orphaned
                .is_some_and(|at| now.saturating_duration_since(at) >= resume)
        });
        let mut ended = Vec::new();
        for session_id in expired {
            let Some(session) = self.remove_session(&session_id) else {
                continue;
            };
            if self.claims.get(&session_id) == Some(&session.client_conn) {
                self.claims.remove(&session_id);
            }
            let notice = messages::disconnected(&session_id, None);
            let notices = vec![(session.robot_conn.clone(), notice)];
            ended.push(EndedSession::of(session_id, session, notices));
        }
        ended
    }

    /// With a resume window, a client's sessions with a robot on this node wait for it
    /// instead of ending with its socket; returns their ids.
    pub(in crate::relay) fn orphan_sessions_of(
        &mut self,
        conn: &ConnId,
        entry: &mut ConnEntry,
        now: Instant,
    ) -> Vec<String> {
        if self.limits.resume.is_zero() || !matches!(entry.kind, ConnKind::Client { .. }) {
            return Vec::new();
        }
        let mut waiting = Vec::new();
        for id in &entry.sessions {
            if let Some(session) = self.sessions.get_mut(id) {
                // Robot on this node only: a robot's node routes by the client's socket
                // id, which a resume changes.
                if &session.client_conn == conn && session.remote.is_none() {
                    session.orphaned = Some(now);
                    waiting.push(id.clone());
                }
            }
        }
        for id in &waiting {
            entry.sessions.remove(id);
        }
        waiting
    }

    /// Ends the sessions of a socket that left; the other end of each is to be told.
    pub(in crate::relay) fn end_sessions_of_conn(
        &mut self,
        conn: &ConnId,
        sessions: HashSet<String>,
    ) -> Vec<EndedSession> {
        let mut ended = Vec::new();
        for session_id in sessions {
            if let Some(session) = self.remove_session(&session_id) {
                let other = if &session.client_conn == conn {
                    session.robot_conn.clone()
                } else {
                    session.client_conn.clone()
                };
                let notice = messages::disconnected(&session_id, None);
                ended.push(EndedSession::of(session_id, session, vec![(other, notice)]));
            }
        }
        ended
    }

    /// Forgets sessions whose grace period is over, and releases their ids.
    pub(in crate::relay) fn prune_ended(&mut self, now: Instant) {
        let grace = self.limits.grace;
        while let Some((at, _)) = self.ended_order.front() {
            if now.saturating_duration_since(*at) < grace {
                break;
            }
            let Some((_, id)) = self.ended_order.pop_front() else {
                break;
            };
            // A session reopened under this id has its own life; only a forgotten one frees
            // it.
            if self.sessions.contains_key(&id) || self.ended.remove(&id).is_none() {
                continue;
            }
            if let Some(owner) = self.claims.get(&id).cloned() {
                if &*owner != id.as_str() {
                    self.claims.remove(&id);
                    if let Some(entry) = self.conns.get_mut(&owner) {
                        entry.claimed.retain(|claimed| *claimed != id);
                    }
                }
            }
        }
    }

    fn remove_session(&mut self, session_id: &str) -> Option<Session> {
        let session = self.sessions.remove(session_id)?;
        let now = Instant::now();
        self.ended.insert(
            session_id.to_string(),
            Ended {
                client_conn: session.client_conn.clone(),
                robot_conn: session.robot_conn.clone(),
                subject: session.subject.clone(),
                role: session.role,
                at: now,
            },
        );
        self.ended_order.push_back((now, session_id.to_string()));
        for conn in [&session.client_conn, &session.robot_conn] {
            if let Some(entry) = self.conns.get_mut(conn) {
                entry.sessions.remove(session_id);
            }
        }
        Some(session)
    }
}

fn local_end(session: &Session) -> Option<ConnId> {
    match (&session.remote, session.mirror) {
        (None, _) => None,
        (Some(_), true) => Some(session.robot_conn.clone()),
        (Some(_), false) => Some(session.client_conn.clone()),
    }
}
