//! What opening a session must pass: the id is not another subject's, the socket's session
//! count, the robot's control lock (and whether anyone holds it), the viewer caps.

use super::*;

impl State {
    /// The id ended within the grace period as another subject's session.
    pub(super) fn ended_for_another(&self, session_id: &str, subject: &str) -> bool {
        self.ended
            .get(session_id)
            .is_some_and(|ended| *ended.subject != *subject)
    }

    pub(super) fn check_session_count(
        &self,
        client_conn: &ConnId,
        claimed_already: bool,
    ) -> Result<(), RelayError> {
        let limit = self.limits.sessions_per_conn;
        match self.conns.get(client_conn) {
            Some(entry)
                if entry.sessions.len() >= limit
                    || (!claimed_already && entry.claimed.len() >= limit) =>
            {
                Err(RelayError::TooManySessions { limit })
            }
            _ => Ok(()),
        }
    }

    /// One driving session per robot.
    pub(super) fn check_control(
        &self,
        robot_conn: &ConnId,
        request: &OpenSession<'_>,
    ) -> Result<(), RelayError> {
        let holder = self.conns.get(robot_conn).and_then(|entry| {
            entry
                .sessions
                .iter()
                .filter_map(|id| self.sessions.get(id))
                .find(|s| s.role.may_drive())
        });
        match holder {
            Some(holder) => Err(RelayError::RobotBusy {
                robot_id: request.robot_id.to_string(),
                locked_by: (request.role == Role::Owner).then(|| holder.subject.to_string()),
            }),
            None => Ok(()),
        }
    }

    /// Refuses one more viewing session of `subject` with the robot on `robot_conn` past
    /// the caps. The robot's node sees every session of its robot, mirrors included, so
    /// its count is the cluster's.
    pub(super) fn check_viewers(
        &self,
        robot_conn: &ConnId,
        robot_id: &str,
        subject: &str,
    ) -> Result<(), RelayError> {
        let Some(entry) = self.conns.get(robot_conn) else {
            return Ok(());
        };
        let viewers = entry
            .sessions
            .iter()
            .filter_map(|id| self.sessions.get(id))
            .filter(|s| !s.role.may_drive());
        let (mut all, mut theirs) = (0, 0);
        for session in viewers {
            all += 1;
            theirs += usize::from(*session.subject == *subject);
        }
        let over = |count: usize, limit: usize| limit > 0 && count >= limit;
        let per = if over(theirs, self.limits.viewers_per_subject) {
            ViewerCap::PerSubject
        } else if over(all, self.limits.viewers_per_robot) {
            ViewerCap::PerRobot
        } else {
            return Ok(());
        };
        Err(RelayError::TooManyViewers {
            robot_id: robot_id.to_string(),
            per,
        })
    }

    /// Whether someone drives the robot (an operator or owner holds a session on it).
    pub(in crate::relay) fn is_driven(&self, robot_id: &str) -> bool {
        self.sessions
            .values()
            .any(|s| s.robot_id == robot_id && s.role.may_drive())
    }
}
