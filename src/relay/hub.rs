//! The hub: presence and the session table under one lock, with the router beside it.
//! Private to the relay: [`super::Presence`] and [`super::Sessions`] are its doors. Each
//! operation here takes the lock once, changes the table, and leaves the I/O it implies
//! (records, notices, other nodes) to its caller or to the router.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::routing::{MirrorSession, RemoteRobot, Router};
use super::table::{
    ConnKind, EndedSession, FrameShare, GrantScope, HubLimits, OpenSession, Route, SessionOpened,
    State,
};
use super::RelayError;
use crate::delivery::{ConnId, Outbound};
use crate::metrics::Metrics;
use crate::store::Role;

pub(super) struct Hub {
    state: Mutex<State>,
    pub(super) router: Router,
    pub(super) metrics: Metrics,
}

impl Hub {
    pub(super) fn new(router: Router, metrics: Metrics, limits: HubLimits) -> Hub {
        Hub {
            state: Mutex::new(State::new(limits)),
            router,
            metrics,
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // is worse than losing them, so keep serving with the data as it is.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many cuts of access this node has seen (see `Presence::access_cuts`).
    pub(super) fn access_cuts(&self) -> u64 {
        self.state().access_cuts
    }

    /// Whether the robot is connected to this node.
    pub(super) fn is_here(&self, robot_id: &str) -> bool {
        self.state().robots.contains_key(robot_id)
    }

    /// Checks the session rules and reserves the session before its record is written.
    #[cfg(test)]
    fn open_session(
        &self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
    ) -> Result<SessionOpened, RelayError> {
        self.open_session_at(client_conn, request, None)
    }

    /// Opens a session, with the robot's socket on another node when it is not here.
    pub(super) fn open_session_at(
        &self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
        elsewhere: Option<&RemoteRobot>,
    ) -> Result<SessionOpened, RelayError> {
        let elsewhere = elsewhere.map(|robot| (robot.conn.clone(), robot.node.clone()));
        let mut state = self.state();
        let opened = state.open(client_conn, request, elsewhere)?;
        if let SessionOpened::New {
            robot_conn,
            remote: Some(node),
            ..
        } = &opened
        {
            self.router.add_remote(robot_conn.clone(), node.clone());
        }
        drop(state);
        if matches!(opened, SessionOpened::New { .. }) {
            self.metrics.sessions_active.inc();
        }
        Ok(opened)
    }

    /// Runs `then` if `session_id` is still open with `record_id`, under the table's lock:
    /// whoever ends it afterwards does so after `then` (a notice queued by `then` goes out
    /// before the end's).
    pub(super) fn if_open(&self, session_id: &str, record_id: &str, then: impl FnOnce()) -> bool {
        let state = self.state();
        let open = state.is_open(session_id, record_id);
        if open {
            then();
        }
        open
    }

    /// The robot's node learns of a session whose client is on `client_node`. Refused
    /// when the robot's socket is no longer the one named, or the id is taken here.
    pub(super) fn open_mirror(&self, mirror: &MirrorSession) -> Result<(), RelayError> {
        let mut state = self.state();
        let client_conn = state.open_mirror(mirror)?;
        self.router
            .add_remote(client_conn, Arc::from(mirror.client_node.as_str()));
        drop(state);
        self.metrics.sessions_active.inc();
        Ok(())
    }

    /// Whether `id` names a live session (or a socket's own id) that is not `conn`'s.
    pub(super) fn names_another_session(&self, id: &str, conn: &ConnId) -> bool {
        self.state().names_another_session(id, conn)
    }

    /// Where a message about `session_id` from `sender` goes; only the two ends may talk.
    pub(super) fn route(&self, sender: &ConnId, session_id: &str) -> Result<Route, RelayError> {
        self.state().route(sender, session_id)
    }

    /// Whether a frame from another node may be delivered (see [`State::admits_frame`]).
    /// Every node checks what it delivers against its own table, never only the sender's.
    pub(super) fn admits_frame(
        &self,
        from: &ConnId,
        session_id: &str,
        to: &ConnId,
    ) -> Option<FrameShare> {
        self.state().admits_frame(from, session_id, to)
    }

    /// Each (robot, subject) with sessions in `scope`, and the highest role among them:
    /// what a grant check must allow.
    pub(super) fn session_roles(&self, scope: GrantScope) -> Vec<(String, Arc<str>, Role)> {
        self.state().session_roles(scope)
    }

    /// Ends a session without notices (both ends already know, or it never started).
    pub(super) fn end_session(&self, session_id: &str) -> Option<EndedSession> {
        self.ended(self.state().end_where(session_id, |_| true))
    }

    /// A client said `disconnected`: its session ends, and a robot here hears `to_robot`
    /// at once, under the table's lock, as in [`Hub::tell_robots_now`]. On one node no
    /// control lock orders a new controller after the old one; relaying the end after its
    /// record let the next offer, written in the same round of commits, reach the robot
    /// first. Returns the ended session and whether the robot was told here.
    pub(super) fn end_session_telling_robot(
        &self,
        session_id: &str,
        to_robot: Outbound,
    ) -> Option<(EndedSession, bool)> {
        let mut state = self.state();
        let ended = self.ended(state.end_where(session_id, |_| true))?;
        let robot = &ended.robot_conn;
        let told = self.router.remote_node(robot).is_none()
            && self.router.deliver_here(None, robot, to_robot).is_ok();
        drop(state);
        Some((ended, told))
    }

    /// The node `origin` ended its side of a session: end ours without telling it back.
    /// Only the node holding the session's other end may end it: a node that merely used
    /// the same id (a refused offer) ends nothing here.
    /// `notice` is for the end here (a robot here hears it at once).
    pub(super) fn end_session_from_peer(
        &self,
        session_id: &str,
        origin: &str,
        notice: Option<String>,
    ) -> Option<EndedSession> {
        let mut state = self.state();
        let mut ended = self.ended(state.end_where(session_id, |session| {
            let ours = session.remote() == Some(origin);
            if !ours {
                tracing::debug!(session = %session_id, node = %origin, "end from a node that holds no end of the session ignored");
            }
            ours
        }))?;
        ended.remote = None;
        if let (Some(text), Some(to)) = (notice, ended.local_end().cloned()) {
            ended.notices.push((to, text));
        }
        let mut ended = [ended];
        self.tell_robots_now(&mut ended);
        drop(state);
        let [ended] = ended;
        Some(ended)
    }

    fn ended(&self, ended: Option<EndedSession>) -> Option<EndedSession> {
        if ended.is_some() {
            self.metrics.sessions_active.dec();
        }
        ended
    }

    /// Counts the ended sessions and tells their robots here, before the table's lock
    /// (`state`) goes.
    fn all_ended(
        &self,
        state: MutexGuard<'_, State>,
        mut ended: Vec<EndedSession>,
    ) -> Vec<EndedSession> {
        self.metrics.sessions_active.sub(ended.len() as i64);
        self.tell_robots_now(&mut ended);
        drop(state);
        ended
    }

    /// A robot here hears of a session's end at once, under the table's lock: a session
    /// that takes the ended one's place is opened under that lock too, so its offer always
    /// reaches the robot after the end. (Waiting for the record first, as the other end
    /// does, let a new controller's offer overtake the old one's end while the database was
    /// slow: two controllers, as the robot saw it. Robots do not read records.)
    fn tell_robots_now(&self, ended: &mut [EndedSession]) {
        for session in ended {
            let robot = &session.robot_conn;
            if self.router.remote_node(robot).is_some() {
                continue;
            }
            if let Some(at) = session.notices.iter().position(|(to, _)| to == robot) {
                let (to, text) = session.notices.swap_remove(at);
                let _ = self.router.deliver_here(None, &to, Outbound::text(text));
            }
        }
    }

    /// Ends the sessions whose other end was on `node` (it died): both local ends told.
    pub(super) fn end_sessions_with_node(&self, node: &str, cause: &str) -> Vec<EndedSession> {
        let mut state = self.state();
        let ended = state.end_with_node(node, cause);
        let ended = self.all_ended(state, ended);
        self.router.forget_node(node);
        ended
    }

    /// Forgets remote sockets that no session, live or in its grace period, names.
    pub(super) fn sweep_remote(&self) {
        if !self.router.is_clustered() {
            return;
        }
        // Under the state lock throughout: a session opened meanwhile keeps its entry.
        let mut state = self.state();
        let named = state.named_conns();
        self.router.retain_remote(&named);
        drop(state);
    }

    /// Sessions whose client went away longer ago than the resume window: they end now,
    /// the robot's end to be told.
    pub(super) fn expire_orphans(&self, now: Instant) -> Vec<EndedSession> {
        let mut state = self.state();
        let ended = state.expire_orphans(now);
        self.all_ended(state, ended)
    }

    /// Ends the sessions `subject` has with `robot_id` whose role is above `allowed` (all
    /// of them when `allowed` is None: the grant was withdrawn). Both ends are to be told,
    /// with `cause` as the notice's reason. A cut of access.
    pub(super) fn end_sessions_of(
        &self,
        robot_id: &str,
        subject: &str,
        allowed: Option<Role>,
        cause: &str,
        scope: GrantScope,
    ) -> Vec<EndedSession> {
        let mut state = self.state();
        state.access_cuts += 1;
        let ended = state.end_of_subject(robot_id, subject, allowed, cause, scope);
        self.all_ended(state, ended)
    }

    /// Whether a driving session with `robot_id` has an end here.
    pub(super) fn is_driven(&self, robot_id: &str) -> bool {
        self.state().is_driven(robot_id)
    }

    /// Ends the driving sessions with `robot_id` (an owner takes over).
    pub(super) fn end_driving(&self, robot_id: &str, cause: &str) -> Vec<EndedSession> {
        let mut state = self.state();
        let ended = state.end_driving(robot_id, cause);
        self.all_ended(state, ended)
    }

    /// Ends one session; both ends are to be told.
    pub(super) fn end_one(&self, session_id: &str, cause: &str) -> Vec<EndedSession> {
        let mut state = self.state();
        let ended = state.end_one(session_id, cause);
        self.all_ended(state, ended)
    }

    /// Ends every session (shutdown); both ends of each are to be told.
    pub(super) fn end_all(&self, cause: &str) -> Vec<EndedSession> {
        let mut state = self.state();
        let ended = state.end_all(cause);
        self.all_ended(state, ended)
    }

    /// Removes a socket: its sessions end; the other end of each is to be told. With a
    /// resume window, a client's own sessions wait for it instead (see `expire_orphans`),
    /// if the socket went away by itself (`resumable`): one closed for cause (a revoked or
    /// expired token, a flood) ends its sessions at once.
    pub(super) fn detach(&self, conn: &ConnId, resumable: bool) -> Vec<EndedSession> {
        self.router.detach(conn);
        let mut state = self.state();
        let ended = {
            let now = Instant::now();
            state.prune_ended(now);
            let Some(mut entry) = state.conns.remove(conn) else {
                return Vec::new();
            };
            // Their ids stay claimed (by the gone socket) until resumed or expired.
            let waiting = if resumable {
                state.orphan_sessions_of(conn, &mut entry, now)
            } else {
                Vec::new()
            };
            // Only what this socket claimed: scanning every claim made a mass disconnect
            // quadratic (it showed in relay profiles as `memcmp`).
            for id in entry.claimed.iter().map(String::as_str).chain([&**conn]) {
                if waiting.iter().any(|w| w == id) {
                    continue;
                }
                if state.claims.get(id) == Some(conn) {
                    state.claims.remove(id);
                }
            }
            if let ConnKind::Robot { robot_id, .. } = &entry.kind {
                if state.robots.get(robot_id) == Some(conn) {
                    state.robots.remove(robot_id);
                    self.metrics.robots_online.dec();
                    self.router.presence_down(robot_id, conn);
                }
            }
            state.end_sessions_of_conn(conn, entry.sessions)
        };
        self.all_ended(state, ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::{Kick, Mailbox, MailboxReceiver, Outbound, QueueLimits};
    use crate::messages::ViewerCap;
    use crate::relay::presence::RobotVerified;
    use crate::relay::Presence;

    /// The hub with its presence door, as the relay builds them.
    struct TestHub {
        hub: Arc<Hub>,
        presence: Presence,
    }

    impl std::ops::Deref for TestHub {
        type Target = Hub;
        fn deref(&self) -> &Hub {
            &self.hub
        }
    }

    impl TestHub {
        fn attach(&self, conn: ConnId, mailbox: Mailbox) {
            self.presence.attach(conn, mailbox)
        }
        fn access_cuts(&self) -> u64 {
            self.presence.access_cuts()
        }
        fn note_access_cut(&self) {
            self.presence.note_access_cut()
        }
        fn robot_verified(
            &self,
            conn: &ConnId,
            id: &str,
            creds: Vec<String>,
            seen: u64,
        ) -> RobotVerified {
            self.presence.robot_verified(
                conn,
                id,
                creds,
                crate::relay::RobotDeclared::default(),
                seen,
            )
        }
        fn set_client(&self, conn: &ConnId, token: Option<String>, seen: u64) -> bool {
            self.presence.set_client(conn, token, seen)
        }
        fn kick_robot_here(&self, id: &str, reason: Kick) -> bool {
            self.presence.kick_robot_here(id, reason)
        }
        fn kick_credentials_here(&self, revoked: &[String], reason: Kick) -> usize {
            self.presence.kick_credentials_here(revoked, reason)
        }
        fn kick_robots_with_credentials(&self, revoked: &[String], reason: Kick) -> usize {
            self.presence.kick_robots_with_credentials(revoked, reason)
        }
        fn kick_token_here(&self, token: &str) -> usize {
            self.presence.kick_token_here(token)
        }
        fn is_online(&self, id: &str) -> bool {
            self.presence.is_online(id)
        }
        fn robots_online(&self) -> usize {
            self.presence.robots_online()
        }
        fn notify(&self, ended: &[EndedSession]) {
            self.hub.router.notify(ended)
        }
    }

    fn hub() -> TestHub {
        hub_with(HubLimits::default())
    }

    fn hub_with(limits: HubLimits) -> TestHub {
        let router = Router::local();
        let hub = Arc::new(Hub::new(router, Metrics::new(), limits));
        TestHub {
            presence: Presence::new(hub.clone()),
            hub,
        }
    }

    fn connect(hub: &TestHub, id: &str) -> (ConnId, MailboxReceiver) {
        let conn: ConnId = Arc::from(id);
        let (mailbox, rx) = Mailbox::new(QueueLimits::new(8, 1 << 20, 0));
        hub.attach(conn.clone(), mailbox);
        (conn, rx)
    }

    /// Session s1 of alice's socket on node b with the robot `robot` here.
    fn alice_on_node_b() -> MirrorSession {
        MirrorSession {
            session_id: "s1".into(),
            record_id: "rec".into(),
            robot_id: "r1".into(),
            robot_conn: "robot".into(),
            client_conn: "client-on-b".into(),
            client_node: "node-b".into(),
            subject: "alice".into(),
            role: Role::Operator,
            offer_id: None,
            kind: crate::messages::SessionKind::Teleop,
        }
    }

    fn open<'a>(session_id: &'a str, role: Role) -> OpenSession<'a> {
        OpenSession {
            session_id,
            robot_id: "r1",
            subject: "alice",
            role,
            offer_id: "offer-1",
            kind: crate::messages::SessionKind::Teleop,
        }
    }

    #[test]
    fn a_cut_between_a_logins_check_and_its_registration_is_reported() {
        let hub = hub();
        let (robot, _robot_rx) = connect(&hub, "robot");
        let (other, _other_rx) = connect(&hub, "other");
        let (client, _client_rx) = connect(&hub, "client");
        // Nothing happened since the login read the count.
        let seen = hub.access_cuts();
        assert!(!hub.robot_verified(&other, "r2", vec![], seen).cut_since);
        // Each kind of cut, made while this login was between its database check and its
        // registration (it finds no socket to close), is reported to the login.
        let cuts: [&dyn Fn(&TestHub); 5] = [
            &|hub| {
                hub.kick_robot_here("r1", Kick::Revoked);
            },
            &|hub| {
                hub.kick_credentials_here(&["key:abc".to_string()], Kick::Revoked);
            },
            &|hub| {
                hub.kick_token_here("t1");
            },
            &|hub| {
                hub.end_sessions_of("r9", "nobody", None, "grant_revoked", GrantScope::Owned);
            },
            &|hub| hub.note_access_cut(),
        ];
        for cut in cuts {
            let seen = hub.access_cuts();
            cut(&hub);
            assert!(hub.robot_verified(&robot, "r1", vec![], seen).cut_since);
            let seen = hub.access_cuts();
            cut(&hub);
            assert!(hub.set_client(&client, Some("t1".into()), seen));
        }
        assert!(!hub.set_client(&client, Some("t1".into()), hub.access_cuts()));
    }

    #[test]
    fn a_leaving_socket_frees_exactly_its_own_claims() {
        let hub = hub();
        let (robot, _robot_rx) = connect(&hub, "robot");
        hub.robot_verified(&robot, "r1", vec![], hub.access_cuts());
        let (alice, _alice_rx) = connect(&hub, "alice");
        let (carol, _carol_rx) = connect(&hub, "carol");
        assert!(hub.open_session(&alice, open("s1", Role::Viewer)).is_ok());
        assert!(hub.open_session(&carol, open("s2", Role::Viewer)).is_ok());
        hub.detach(&alice, true);
        // Alice's session id and her own connection id are free again; Carol's are not.
        let (bob, _bob_rx) = connect(&hub, "bob");
        assert!(hub.open_session(&bob, open("s1", Role::Viewer)).is_ok());
        assert!(hub.open_session(&bob, open("alice", Role::Viewer)).is_ok());
        assert_eq!(
            hub.open_session(&bob, open("s2", Role::Viewer))
                .unwrap_err(),
            RelayError::ConnectionIdInUse("s2".into())
        );
        assert_eq!(
            hub.open_session(&bob, open("carol", Role::Viewer))
                .unwrap_err(),
            RelayError::ConnectionIdInUse("carol".into())
        );
    }

    #[test]
    fn sessions_follow_the_rules() {
        let hub = hub();
        let (robot, mut robot_rx) = connect(&hub, "robot");
        let (alice, _alice_rx) = connect(&hub, "alice");
        let (bob, mut bob_rx) = connect(&hub, "bob");
        assert_eq!(
            hub.open_session(&alice, open("s1", Role::Operator))
                .unwrap_err(),
            RelayError::RobotOffline("r1".into())
        );
        hub.robot_verified(&robot, "r1", vec!["serial:01".into()], hub.access_cuts());
        assert!(matches!(
            hub.open_session(&alice, open("s1", Role::Operator)),
            Ok(SessionOpened::New { .. })
        ));
        // Renegotiation by the owner, theft by another socket.
        assert!(matches!(
            hub.open_session(&alice, open("s1", Role::Operator)),
            Ok(SessionOpened::Existing { .. })
        ));
        assert_eq!(
            hub.open_session(&bob, open("s1", Role::Operator))
                .unwrap_err(),
            RelayError::ConnectionIdInUse("s1".into())
        );
        // A socket's own id is claimed from the start.
        assert_eq!(
            hub.open_session(&bob, open("alice", Role::Viewer))
                .unwrap_err(),
            RelayError::ConnectionIdInUse("alice".into())
        );
        let busy = OpenSession {
            subject: "bob",
            ..open("s2", Role::Owner)
        };
        assert!(matches!(
            hub.open_session(&bob, busy),
            Err(RelayError::RobotBusy { locked_by, .. }) if locked_by.as_deref() == Some("alice")
        ));
        assert!(hub.open_session(&bob, open("s3", Role::Viewer)).is_ok());
        assert!(hub.route(&bob, "s1").is_err());
        let route = hub.route(&robot, "s1").unwrap();
        assert!(route.from_robot);
        assert_eq!(route.target, alice);
        assert_eq!(
            hub.kick_robots_with_credentials(&["serial:02".into()], Kick::Revoked),
            0
        );
        assert_eq!(
            hub.kick_robots_with_credentials(&["serial:01".into()], Kick::Revoked),
            1
        );
        assert_eq!(robot_rx.kick.get(), Some(Kick::Revoked));
        // The robot leaves: both clients hear about their sessions.
        let ended = hub.detach(&robot, true);
        assert_eq!(ended.len(), 2);
        hub.notify(&ended);
        assert!(!hub.is_online("r1"));
        let notice = match bob_rx.queue.try_recv() {
            Some(Outbound::Text(t)) => t.to_string(),
            other => panic!("expected a notice, got {other:?}"),
        };
        assert!(notice.contains("signalling.disconnected") && notice.contains("s3"));
        assert!(robot_rx.queue.try_recv().is_none());
    }

    #[test]
    fn a_session_from_another_node_routes_the_robot_end_only() {
        let hub = hub();
        let (robot, _robot_rx) = connect(&hub, "robot");
        hub.robot_verified(&robot, "r1", Vec::new(), hub.access_cuts());
        let mirror = alice_on_node_b();
        hub.open_mirror(&mirror).unwrap();
        // The robot's messages go to the client on the other node.
        let route = hub.route(&robot, "s1").unwrap();
        assert!(route.from_robot);
        assert_eq!(&*route.target, "client-on-b");
        // A second copy, or one for a socket that is not the robot's, is refused.
        assert!(hub.open_mirror(&mirror).is_err());
        let stale = MirrorSession {
            session_id: "s2".into(),
            robot_conn: "gone".into(),
            ..mirror.clone()
        };
        assert!(hub.open_mirror(&stale).is_err());
        // Mirrors are ended by their owner node, not by a local grant change...
        assert!(hub
            .end_sessions_of("r1", "alice", None, "grant_revoked", GrantScope::Owned)
            .is_empty());
        assert!(hub.session_roles(GrantScope::Owned).is_empty());
        // ...except in the check after a bus lapse, when the owner's word may be lost.
        assert_eq!(
            hub.session_roles(GrantScope::EveryEndHere),
            vec![("r1".to_string(), Arc::from("alice"), Role::Operator)]
        );
        let ended = hub.end_sessions_of(
            "r1",
            "alice",
            Some(Role::Operator),
            "grant_changed",
            GrantScope::EveryEndHere,
        );
        assert!(ended.is_empty(), "the role still stands");
        hub.open_mirror(&MirrorSession {
            session_id: "s3".into(),
            ..mirror.clone()
        })
        .unwrap();
        let ended = hub.end_sessions_of(
            "r1",
            "alice",
            Some(Role::Viewer),
            "grant_changed",
            GrantScope::EveryEndHere,
        );
        assert_eq!(ended.len(), 2);
        assert!(ended.iter().all(|e| e.local_end() == Some(&robot)));
        hub.open_mirror(&mirror).unwrap();
        let ended = hub.end_session_from_peer("s1", "node-b", None).unwrap();
        assert_eq!(ended.local_end(), Some(&robot));
        assert!(matches!(hub.route(&robot, "s1"), Err(RelayError::Ended(_))));
    }

    /// Issue 29: a session id is its owner's cluster-wide, live and within its grace period.
    #[test]
    fn a_session_id_stays_its_owners_across_nodes() {
        let hub = hub();
        let (robot, _robot_rx) = connect(&hub, "robot");
        let (mallory, _mallory_rx) = connect(&hub, "mallory");
        hub.robot_verified(&robot, "r1", Vec::new(), hub.access_cuts());
        let alice_on_b = ConnId::from("client-on-b");
        let mirror = alice_on_node_b();
        let mallory_on_c = MirrorSession {
            client_conn: "client-on-c".into(),
            client_node: "node-c".into(),
            subject: "mallory".into(),
            role: Role::Viewer,
            ..mirror.clone()
        };
        let viewer = OpenSession {
            subject: "mallory",
            ..open("s1", Role::Viewer)
        };
        let in_use = Err(RelayError::ConnectionIdInUse("s1".into()));
        hub.open_mirror(&mirror).unwrap();
        // Not claimed here (its client is elsewhere), yet nobody here may name it...
        assert_eq!(hub.open_session(&mallory, viewer).map(|_| ()), in_use);
        // ...nor a client on a third node.
        assert_eq!(hub.open_mirror(&mallory_on_c), in_use);
        // Frames cross only between its two ends.
        let live = hub.admits_frame(&alice_on_b, "s1", &robot).unwrap();
        assert!(!live.ended);
        assert!(hub.admits_frame(&robot, "s1", &alice_on_b).is_some());
        assert!(hub
            .admits_frame(&ConnId::from("client-on-c"), "s1", &robot)
            .is_none());
        assert!(hub.admits_frame(&alice_on_b, "s2", &robot).is_none());
        // Only the node of its other end may end it.
        assert!(hub.end_session_from_peer("s1", "node-c", None).is_none());
        assert!(hub.route(&robot, "s1").is_ok());
        hub.end_session_from_peer("s1", "node-b", None).unwrap();
        // Ended: its last messages still cross, marked late (the receiving node lets only
        // a `disconnected` through); the id stays alice's for the grace period.
        let late = hub.admits_frame(&alice_on_b, "s1", &robot).unwrap();
        assert!(late.ended);
        assert!(hub
            .admits_frame(&ConnId::from("client-on-c"), "s1", &robot)
            .is_none());
        assert_eq!(hub.open_session(&mallory, viewer).map(|_| ()), in_use);
        assert_eq!(hub.open_mirror(&mallory_on_c), in_use);
        hub.open_mirror(&mirror).unwrap();
    }

    /// Issue 29, item 4: viewing sessions are capped per subject and per robot; a
    /// controller still finds its place.
    #[test]
    fn viewers_are_capped_per_subject_and_per_robot() {
        let hub = hub_with(HubLimits {
            viewers_per_subject: 2,
            viewers_per_robot: 3,
            ..HubLimits::default()
        });
        let (robot, _robot_rx) = connect(&hub, "robot");
        hub.robot_verified(&robot, "r1", Vec::new(), hub.access_cuts());
        let (mallory, _m) = connect(&hub, "mallory");
        let (carol, _c) = connect(&hub, "carol");
        let (alice, _a) = connect(&hub, "alice");
        let viewer = |session_id, subject| OpenSession {
            subject,
            ..open(session_id, Role::Viewer)
        };
        hub.open_session(&mallory, viewer("m1", "mallory")).unwrap();
        hub.open_session(&mallory, viewer("m2", "mallory")).unwrap();
        assert!(matches!(
            hub.open_session(&mallory, viewer("m3", "mallory")),
            Err(RelayError::TooManyViewers {
                per: ViewerCap::PerSubject,
                ..
            })
        ));
        hub.open_session(&carol, viewer("c1", "carol")).unwrap();
        assert!(matches!(
            hub.open_session(&carol, viewer("c2", "carol")),
            Err(RelayError::TooManyViewers {
                per: ViewerCap::PerRobot,
                ..
            })
        ));
        hub.open_session(&alice, open("a1", Role::Operator))
            .unwrap();
    }

    #[test]
    fn a_new_robot_connection_replaces_the_old_one() {
        let hub = hub();
        let (old, old_rx) = connect(&hub, "old");
        let (new, _new_rx) = connect(&hub, "new");
        hub.robot_verified(&old, "r1", Vec::new(), hub.access_cuts());
        hub.robot_verified(&new, "r1", Vec::new(), hub.access_cuts());
        assert_eq!(old_rx.kick.get(), Some(Kick::Replaced));
        // The old socket leaving must not take the new one offline.
        hub.detach(&old, true);
        assert!(hub.is_online("r1"));
        assert_eq!(hub.robots_online(), 1);
    }
}
