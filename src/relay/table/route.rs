//! Where a session's frames go: only its two ends may talk, here or, within the grace
//! period, from another node.

use super::*;

impl State {
    /// Whether `id` names a live session (or a socket's own id) that is not `conn`'s.
    pub(in crate::relay) fn names_another_session(&self, id: &str, conn: &ConnId) -> bool {
        self.claims.get(id).is_some_and(|owner| owner != conn)
            || self
                .sessions
                .get(id)
                .is_some_and(|s| s.client_conn != *conn && s.robot_conn != *conn)
    }

    /// Where a message about `session_id` from `sender` goes; only the two ends may talk.
    pub(in crate::relay) fn route(
        &self,
        sender: &ConnId,
        session_id: &str,
    ) -> Result<Route, RelayError> {
        let Some(session) = self.sessions.get(session_id) else {
            return Err(match self.ended.get(session_id) {
                Some(ended)
                    if (&ended.client_conn == sender || &ended.robot_conn == sender)
                        && ended.at.elapsed() < self.limits.grace =>
                {
                    RelayError::Ended(session_id.to_string())
                }
                _ => RelayError::UnknownSession(session_id.to_string()),
            });
        };
        let (target, from_robot) = if &session.client_conn == sender {
            (session.robot_conn.clone(), false)
        } else if &session.robot_conn == sender {
            (session.client_conn.clone(), true)
        } else {
            return Err(RelayError::NotInSession(session_id.to_string()));
        };
        Ok(Route {
            target,
            record_id: session.record_id.clone(),
            from_robot,
            subject: session.subject.clone(),
            role: session.role,
            kind: session.kind,
        })
    }

    /// Whether a frame from another node may be delivered: `from` and `to` are the two ends
    /// of `session_id` here, live or within its grace period (the last `disconnected` of a
    /// session travels after the session's end). Returns whose share of the receiver's
    /// queue it counts against.
    pub(in crate::relay) fn admits_frame(
        &self,
        from: &ConnId,
        session_id: &str,
        to: &ConnId,
    ) -> Option<FrameShare> {
        let (client, robot, subject, role, ended) = match self.sessions.get(session_id) {
            Some(s) => (&s.client_conn, &s.robot_conn, &s.subject, s.role, false),
            None => {
                let ended = self.ended.get(session_id)?;
                if ended.at.elapsed() >= self.limits.grace {
                    return None;
                }
                (
                    &ended.client_conn,
                    &ended.robot_conn,
                    &ended.subject,
                    ended.role,
                    true,
                )
            }
        };
        if client == from && robot == to {
            Some(FrameShare {
                share: subject.clone(),
                viewer: !role.may_drive(),
                ended,
            })
        } else if robot == from && client == to {
            Some(FrameShare {
                share: from.clone(),
                viewer: false,
                ended,
            })
        } else {
            None
        }
    }
}
