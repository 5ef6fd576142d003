//! Copies of sessions whose client is on another node: the robot's node keeps one so it
//! routes and checks that session's frames as its own, and sweeps the remote sockets no
//! session names any more.

use super::*;
use crate::relay::routing::MirrorSession;

impl State {
    /// The robot's node learns of a session whose client is on `client_node`. Refused
    /// when the robot's socket is no longer the one named, or the id is taken here.
    pub(in crate::relay) fn open_mirror(
        &mut self,
        mirror: &MirrorSession,
    ) -> Result<ConnId, RelayError> {
        self.prune_ended(Instant::now());
        let robot_conn = match self.robots.get(&mirror.robot_id) {
            Some(conn) if **conn == *mirror.robot_conn => conn.clone(),
            _ => return Err(RelayError::RobotOffline(mirror.robot_id.clone())),
        };
        if self.sessions.contains_key(&mirror.session_id)
            || self
                .claims
                .get(&mirror.session_id)
                .is_some_and(|owner| **owner != *mirror.client_conn)
            || self.ended_for_another(&mirror.session_id, &mirror.subject)
        {
            return Err(RelayError::ConnectionIdInUse(mirror.session_id.clone()));
        }
        if mirror.kind == SessionKind::Arp && !self.serves_arp(&robot_conn, &None) {
            return Err(RelayError::ArpUnsupported(mirror.robot_id.clone()));
        }
        if !mirror.role.may_drive() {
            self.check_viewers(&robot_conn, &mirror.robot_id, &mirror.subject)?;
        }
        let client_conn = ConnId::from(mirror.client_conn.as_str());
        self.insert(
            &mirror.session_id,
            Session {
                record_id: Arc::from(mirror.record_id.as_str()),
                robot_id: mirror.robot_id.clone(),
                robot_conn,
                client_conn: client_conn.clone(),
                subject: Arc::from(mirror.subject.as_str()),
                role: mirror.role,
                remote: Some(Arc::from(mirror.client_node.as_str())),
                mirror: true,
                orphaned: None,
                kind: mirror.kind,
            },
        );
        Ok(client_conn)
    }

    /// Every socket a session, live or in its grace period, names.
    pub(in crate::relay) fn named_conns(&mut self) -> HashSet<ConnId> {
        self.prune_ended(Instant::now());
        self.sessions
            .values()
            .flat_map(|s| [s.client_conn.clone(), s.robot_conn.clone()])
            .chain(
                self.ended
                    .values()
                    .flat_map(|e| [e.client_conn.clone(), e.robot_conn.clone()]),
            )
            .collect()
    }
}
