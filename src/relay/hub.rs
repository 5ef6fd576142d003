use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::bus::{Bus, ConnId, DeliveryError, Kick, Mailbox, Outbound, Sender};
use crate::cluster::{Cluster, Control, FrameOut, MirrorSession, RemoteRobot};
use crate::messages;
use crate::metrics::Metrics;
use crate::store::Role;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RelayError {
    #[error("connectionId {0} belongs to another connection")]
    ConnectionIdInUse(String),
    #[error("session {0} is bound to another robot")]
    SessionRobotMismatch(String),
    #[error("robot {0} is offline")]
    RobotOffline(String),
    #[error("robot {robot_id} is controlled by another session")]
    RobotBusy {
        robot_id: String,
        /// Who holds the control; shown only to the robot's owners.
        locked_by: Option<String>,
    },
    #[error("not a member of session {0}")]
    NotInSession(String),
    /// No live session has this id (it never existed, or ended and its grace is over).
    #[error("no session {0}")]
    UnknownSession(String),
    /// The session ended a moment ago and the sender was one of its ends: a late message,
    /// not an error (both ends send `disconnected` when the link drops).
    #[error("session {0} has ended")]
    Ended(String),
    #[error("at most {limit} sessions per connection")]
    TooManySessions { limit: usize },
    /// Viewing sessions are capped per subject and per robot, so viewers cannot take every
    /// place a robot has (its agent serves a bounded number of sessions).
    #[error("too many viewing sessions with robot {robot_id} ({})", per.as_str())]
    TooManyViewers { robot_id: String, per: ViewerCap },
}

/// Which cap on viewing sessions an offer ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViewerCap {
    PerSubject,
    PerRobot,
}

impl ViewerCap {
    /// Its name on the wire (`details.per`).
    pub fn as_str(self) -> &'static str {
        match self {
            ViewerCap::PerSubject => "per_subject",
            ViewerCap::PerRobot => "per_robot",
        }
    }
}

/// Per-socket caps and how long an ended session is remembered.
#[derive(Debug, Clone, Copy)]
pub struct HubLimits {
    /// Live sessions, and session ids claimed (live or recently ended), per socket.
    pub sessions_per_conn: usize,
    /// How long after its end a session's two ends may still mention it.
    pub grace: Duration,
    /// How long a session outlives its client's socket, waiting for the same subject to
    /// take it back from a new socket (zero: it ends with the socket).
    pub resume: Duration,
    /// Viewing sessions with one robot, per subject and in all (0: no limit).
    pub viewers_per_subject: usize,
    pub viewers_per_robot: usize,
}

impl Default for HubLimits {
    fn default() -> Self {
        HubLimits {
            sessions_per_conn: 16,
            grace: Duration::from_secs(60),
            resume: Duration::ZERO,
            viewers_per_subject: 4,
            viewers_per_robot: 12,
        }
    }
}

/// What a socket is, once known.
#[derive(Debug, Clone)]
enum ConnKind {
    Pending,
    /// A verified robot and the revocation entries of the credential it proved.
    Robot {
        robot_id: String,
        credentials: Vec<String>,
    },
    Client {
        token_id: Option<String>,
    },
}

/// How a socket proved who it is, for checking it again (see [`Hub::local_logins`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoggedInWith {
    Robot {
        robot_id: String,
        credentials: Vec<String>,
    },
    Token(String),
}

struct ConnEntry {
    kind: ConnKind,
    sessions: HashSet<String>,
    /// Session ids claimed besides its own connection id, live or within the grace period
    /// (at most the per-socket session limit): what its detach must release.
    claimed: Vec<String>,
}

/// A session that ended within the grace period: who its ends were, and whose it was (its
/// id stays theirs until the grace period is over: a peer that kept the link up may still
/// act on it).
struct Ended {
    client_conn: ConnId,
    robot_conn: ConnId,
    subject: Arc<str>,
    role: Role,
    at: Instant,
}

#[derive(Debug, Clone)]
struct Session {
    /// Shared strings: every relayed message hands them out in its `Route`.
    record_id: Arc<str>,
    robot_id: String,
    robot_conn: ConnId,
    client_conn: ConnId,
    subject: Arc<str>,
    role: Role,
    /// The node of the end that is not on this node (multi-node).
    remote: Option<Arc<str>>,
    /// The client is on another node, which owns the session (its record's node and its
    /// control lock); this node holds a copy for routing the robot's messages.
    mirror: bool,
    /// When the client's socket went away, if the session waits to be resumed.
    orphaned: Option<Instant>,
}

#[derive(Default)]
struct State {
    conns: HashMap<ConnId, ConnEntry>,
    robots: HashMap<String, ConnId>,
    sessions: HashMap<String, Session>,
    /// Session ids (connectionIds) and the socket that owns each: the first that used it.
    claims: HashMap<String, ConnId>,
    /// Sessions that ended within the grace period, and their end times in order.
    ended: HashMap<String, Ended>,
    ended_order: VecDeque<(Instant, String)>,
    /// Counts cuts of access (a robot's revocation, re-enrollment or deletion, a token's
    /// revocation, a grant withdrawn or lowered, a lapse re-check), so a login or an offer
    /// can tell whether one came between its database check and its registration here
    /// (see [`Hub::access_cuts`]).
    access_cuts: u64,
}

/// A robot registered by [`Hub::robot_verified`].
#[derive(Debug)]
pub struct RobotVerified {
    /// Resolves once the robot's presence is in the cluster's directory (with a cluster).
    pub presence: Option<tokio::sync::oneshot::Receiver<()>>,
    /// A cut of access happened since the login read [`Hub::access_cuts`].
    pub cut_since: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct OpenSession<'a> {
    pub session_id: &'a str,
    pub robot_id: &'a str,
    pub subject: &'a str,
    pub role: Role,
    /// The offer's message id (a refusal from another node names it).
    pub offer_id: &'a str,
}

#[derive(Debug)]
pub enum SessionOpened {
    /// A new session: its record must be written, then the offer forwarded.
    New {
        record_id: String,
        robot_conn: ConnId,
    },
    /// A renegotiation offer within an existing session of this client.
    Existing { robot_conn: ConnId },
}

/// Whose share of its receiver's queue a frame from another node counts against (see
/// [`super::bus::Sender`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameShare {
    pub share: Arc<str>,
    pub viewer: bool,
}

impl FrameShare {
    pub fn sender(&self) -> Sender<'_> {
        Sender {
            share: &self.share,
            viewer: self.viewer,
        }
    }
}

/// Where a session message goes.
#[derive(Debug, Clone)]
pub struct Route {
    pub target: ConnId,
    pub record_id: Arc<str>,
    /// The sender is the robot end of the session.
    pub from_robot: bool,
    pub subject: Arc<str>,
    pub role: Role,
}

/// Which sessions a grant check covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantScope {
    /// The sessions this node owns. A mirror (the robot's end of a session owned by another
    /// node) is ended by its owner, which hears of the grant change too and tells this node.
    Owned,
    /// Every session with an end here, mirrors too: after a bus lapse the owner's word that
    /// it ended a session may have been lost on its way here, as the change itself was.
    /// Ending a mirror tells its owner, which ignores the end of a session it already ended.
    EveryEndHere,
}

impl GrantScope {
    fn covers(self, session: &Session) -> bool {
        self == GrantScope::EveryEndHere || !session.mirror
    }
}

/// A session that ended: its record must be closed, then `notices` delivered with
/// [`Hub::notify`] (in that order, so whoever hears of the end finds the record ended).
#[derive(Debug, Clone)]
pub struct EndedSession {
    pub session_id: String,
    pub record_id: String,
    notices: Vec<(ConnId, String)>,
    /// The other end's node, to be told (None: local, or the other node told us).
    remote: Option<Arc<str>>,
    /// The end on this node, when the other is on another node.
    local_end: Option<ConnId>,
}

impl EndedSession {
    /// The end of a two-node session that is on this node.
    pub fn local_end(&self) -> Option<&ConnId> {
        self.local_end.as_ref()
    }
}

pub struct Hub {
    state: Mutex<State>,
    bus: Arc<dyn Bus>,
    metrics: Metrics,
    limits: HubLimits,
    /// The other nodes, when several share a Redis.
    cluster: Option<Arc<Cluster>>,
    /// Sockets on other nodes that sessions here talk to, and their node. Kept apart from
    /// `state` so that delivery takes only this small lock; swept by [`Hub::sweep_remote`]
    /// once neither a session nor its grace period names them.
    remote: Mutex<HashMap<ConnId, Arc<str>>>,
}

impl Hub {
    pub fn new(bus: Arc<dyn Bus>, metrics: Metrics, limits: HubLimits) -> Hub {
        Hub {
            state: Mutex::new(State::default()),
            bus,
            metrics,
            limits,
            cluster: None,
            remote: Mutex::new(HashMap::new()),
        }
    }

    /// A hub that shares presence, sessions and kicks with other nodes through `cluster`.
    pub fn with_cluster(mut self, cluster: Arc<Cluster>) -> Hub {
        self.cluster = Some(cluster);
        self
    }

    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    fn remote_map(&self) -> MutexGuard<'_, HashMap<ConnId, Arc<str>>> {
        self.remote
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The node of a socket on another node that a session here names.
    pub fn remote_node(&self, conn: &ConnId) -> Option<Arc<str>> {
        // Single node: no lookup at all on the relay path.
        self.cluster.as_ref()?;
        self.remote_map().get(conn).cloned()
    }

    /// The other nodes that sessions here have an end on.
    pub fn remote_nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self.remote_map().values().map(|n| n.to_string()).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // is worse than losing them, so keep serving with the data as it is.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a new socket; its own connection id is claimed for it from the start, so
    /// nobody else can open a session under it.
    pub fn attach(&self, conn: ConnId, mailbox: Mailbox) {
        self.bus.attach(conn.clone(), mailbox);
        let mut state = self.state();
        state.claims.insert(conn.to_string(), conn.clone());
        state.conns.insert(
            conn,
            ConnEntry {
                kind: ConnKind::Pending,
                sessions: HashSet::new(),
                claimed: Vec::new(),
            },
        );
    }

    /// Marks the socket as a client's, logged in with `token_id` (an opaque token) or a JWT.
    /// True if a cut of access happened since the login read `cuts_seen` (before its token
    /// check): the token must then be checked again, as in [`Hub::robot_verified`].
    pub fn set_client(&self, conn: &ConnId, token_id: Option<String>, cuts_seen: u64) -> bool {
        let mut state = self.state();
        let cut_since = state.access_cuts != cuts_seen;
        if let Some(entry) = state.conns.get_mut(conn) {
            entry.kind = ConnKind::Client { token_id };
        }
        cut_since
    }

    /// How many cuts of access this node has seen. A cut closes the sockets or ends the
    /// sessions it finds; one that lands after a login's or an offer's database check but
    /// before its socket or session is registered finds nothing. So the login or offer
    /// reads this count before its check, and if it changed by the time it is registered,
    /// checks again ([`Hub::robot_verified`], [`Hub::set_client`], the offer).
    pub fn access_cuts(&self) -> u64 {
        self.state().access_cuts
    }

    /// A cut is on its way that does not come through the kicks here (the re-check after a
    /// bus lapse): logins and offers checked before it must check again.
    pub fn note_access_cut(&self) {
        self.state().access_cuts += 1;
    }

    /// Marks the socket as the verified connection of `robot_id`; an older connection of the
    /// same robot is closed. In a cluster, the answer's `presence` resolves once every node
    /// can find the robot (see [`Cluster::presence_up`]).
    ///
    /// A cut either finds the robot registered, or happened after the login read
    /// `cuts_seen` and the answer's `cut_since` says so: the login must then check again
    /// whether it still stands (its check may have run before the cut's database write).
    /// Counting and registering under one lock leaves no gap.
    pub fn robot_verified(
        &self,
        conn: &ConnId,
        robot_id: &str,
        credentials: Vec<String>,
        cuts_seen: u64,
    ) -> RobotVerified {
        let (replaced, cut_since) = {
            let mut state = self.state();
            let cut_since = state.access_cuts != cuts_seen;
            if let Some(entry) = state.conns.get_mut(conn) {
                entry.kind = ConnKind::Robot {
                    robot_id: robot_id.to_string(),
                    credentials,
                };
            }
            (
                state.robots.insert(robot_id.to_string(), conn.clone()),
                cut_since,
            )
        };
        match replaced {
            Some(old) if &old != conn => self.bus.kick(&old, Kick::Replaced),
            Some(_) => {}
            None => self.metrics.robots_online.inc(),
        }
        let presence = self
            .cluster
            .as_ref()
            .and_then(|cluster| cluster.presence_up(robot_id, conn));
        RobotVerified {
            presence,
            cut_since,
        }
    }

    /// What each verified socket here logged in with: robots with the revocation entries
    /// of their credential, clients with their opaque token (JWT clients have none to check).
    pub fn local_logins(&self) -> Vec<(ConnId, LoggedInWith)> {
        self.state()
            .conns
            .iter()
            .filter_map(|(conn, entry)| {
                let login = match &entry.kind {
                    ConnKind::Robot {
                        robot_id,
                        credentials,
                    } => LoggedInWith::Robot {
                        robot_id: robot_id.clone(),
                        credentials: credentials.clone(),
                    },
                    ConnKind::Client {
                        token_id: Some(token_id),
                    } => LoggedInWith::Token(token_id.clone()),
                    _ => return None,
                };
                Some((conn.clone(), login))
            })
            .collect()
    }

    /// Each (robot, subject) with sessions in `scope`, and the highest role among them:
    /// what a grant check must allow.
    pub fn session_roles(&self, scope: GrantScope) -> Vec<(String, Arc<str>, Role)> {
        let mut highest: HashMap<(&str, &Arc<str>), Role> = HashMap::new();
        let state = self.state();
        for session in state.sessions.values().filter(|s| scope.covers(s)) {
            let role = highest
                .entry((session.robot_id.as_str(), &session.subject))
                .or_insert(session.role);
            *role = (*role).max(session.role);
        }
        highest
            .into_iter()
            .map(|((robot_id, subject), role)| (robot_id.to_string(), subject.clone(), role))
            .collect()
    }

    /// The robots connected to this node and their sockets.
    pub fn local_robots(&self) -> Vec<(String, ConnId)> {
        self.state()
            .robots
            .iter()
            .map(|(id, conn)| (id.clone(), conn.clone()))
            .collect()
    }

    /// Whether `conn` is a verified robot's socket on this node.
    pub fn is_robot(&self, conn: &ConnId) -> bool {
        self.state()
            .conns
            .get(conn)
            .is_some_and(|entry| matches!(entry.kind, ConnKind::Robot { .. }))
    }

    pub fn is_online(&self, robot_id: &str) -> bool {
        self.state().robots.contains_key(robot_id)
    }

    pub fn robots_online(&self) -> usize {
        self.state().robots.len()
    }

    /// Checks the session rules and reserves the session before its record is written.
    pub fn open_session(
        &self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
    ) -> Result<SessionOpened, RelayError> {
        self.open_session_at(client_conn, request, None)
    }

    /// [`Hub::open_session`], with the robot's socket on another node when it is not here.
    pub fn open_session_at(
        &self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
        elsewhere: Option<&RemoteRobot>,
    ) -> Result<SessionOpened, RelayError> {
        let mut state = self.state();
        prune_ended(&mut state, self.limits.grace, Instant::now());
        if let Some(robot_conn) = self.resume(&mut state, client_conn, &request)? {
            return Ok(SessionOpened::Existing { robot_conn });
        }
        let claimed_already = match state.claims.get(request.session_id) {
            Some(owner) if owner != client_conn => {
                return Err(RelayError::ConnectionIdInUse(
                    request.session_id.to_string(),
                ))
            }
            Some(_) => true,
            None => false,
        };
        if let Some(existing) = state.sessions.get(request.session_id) {
            // A session whose client is on another node is not claimed here: the id is
            // still that client's, cluster-wide.
            if existing.client_conn != *client_conn {
                return Err(RelayError::ConnectionIdInUse(
                    request.session_id.to_string(),
                ));
            }
            if existing.robot_id != request.robot_id {
                return Err(RelayError::SessionRobotMismatch(
                    request.session_id.to_string(),
                ));
            }
            return Ok(SessionOpened::Existing {
                robot_conn: existing.robot_conn.clone(),
            });
        }
        if state
            .ended
            .get(request.session_id)
            .is_some_and(|ended| *ended.subject != *request.subject)
        {
            return Err(RelayError::ConnectionIdInUse(
                request.session_id.to_string(),
            ));
        }
        let limit = self.limits.sessions_per_conn;
        if let Some(entry) = state.conns.get(client_conn) {
            if entry.sessions.len() >= limit || (!claimed_already && entry.claimed.len() >= limit) {
                return Err(RelayError::TooManySessions { limit });
            }
        }
        let (robot_conn, remote) = match (state.robots.get(request.robot_id), elsewhere) {
            (Some(conn), _) => (conn.clone(), None),
            (None, Some(robot)) => (robot.conn.clone(), Some(robot.node.clone())),
            (None, None) => return Err(RelayError::RobotOffline(request.robot_id.to_string())),
        };
        if !request.role.may_drive() {
            self.check_viewers(&state, &robot_conn, request.robot_id, request.subject)?;
        }
        if request.role.may_drive() {
            let holder = state.conns.get(&robot_conn).and_then(|entry| {
                entry
                    .sessions
                    .iter()
                    .filter_map(|id| state.sessions.get(id))
                    .find(|s| s.role.may_drive())
            });
            if let Some(holder) = holder {
                let locked_by = (request.role == Role::Owner).then(|| holder.subject.to_string());
                return Err(RelayError::RobotBusy {
                    robot_id: request.robot_id.to_string(),
                    locked_by,
                });
            }
        }
        let record_id = uuid::Uuid::new_v4().to_string();
        let session_id = request.session_id.to_string();
        if !claimed_already {
            state.claims.insert(session_id.clone(), client_conn.clone());
            if let Some(entry) = state.conns.get_mut(client_conn) {
                entry.claimed.push(session_id.clone());
            }
        }
        // Reopened under the same id: late messages now belong to the new session.
        state.ended.remove(&session_id);
        for conn in [client_conn, &robot_conn] {
            if let Some(entry) = state.conns.get_mut(conn) {
                entry.sessions.insert(session_id.clone());
            }
        }
        state.sessions.insert(
            session_id,
            Session {
                record_id: Arc::from(record_id.as_str()),
                robot_id: request.robot_id.to_string(),
                robot_conn: robot_conn.clone(),
                client_conn: client_conn.clone(),
                subject: Arc::from(request.subject),
                role: request.role,
                remote: remote.clone(),
                mirror: false,
                orphaned: None,
            },
        );
        if let Some(node) = remote {
            self.remote_map().insert(robot_conn.clone(), node);
        }
        self.metrics.sessions_active.inc();
        Ok(SessionOpened::New {
            record_id,
            robot_conn,
        })
    }

    /// Refuses one more viewing session of `subject` with the robot on `robot_conn` past
    /// the caps. The robot's node sees every session of its robot, mirrors included, so
    /// its count is the cluster's.
    fn check_viewers(
        &self,
        state: &State,
        robot_conn: &ConnId,
        robot_id: &str,
        subject: &str,
    ) -> Result<(), RelayError> {
        let Some(entry) = state.conns.get(robot_conn) else {
            return Ok(());
        };
        let viewers = entry
            .sessions
            .iter()
            .filter_map(|id| state.sessions.get(id))
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

    /// Whether `id` names a live session (or a socket's own id) that is not `conn`'s.
    pub fn names_another_session(&self, id: &str, conn: &ConnId) -> bool {
        let state = self.state();
        state.claims.get(id).is_some_and(|owner| owner != conn)
            || state
                .sessions
                .get(id)
                .is_some_and(|s| s.client_conn != *conn && s.robot_conn != *conn)
    }

    /// Where a message about `session_id` from `sender` goes; only the two ends may talk.
    pub fn route(&self, sender: &ConnId, session_id: &str) -> Result<Route, RelayError> {
        let state = self.state();
        let Some(session) = state.sessions.get(session_id) else {
            return Err(match state.ended.get(session_id) {
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
        })
    }

    /// Ends a session without notices (both ends already know, or it never started).
    pub fn end_session(&self, session_id: &str) -> Option<EndedSession> {
        self.end_session_where(session_id, |_| true)
    }

    /// [`Hub::end_session`] if the session passes `check`, under the same lock.
    fn end_session_where(
        &self,
        session_id: &str,
        check: impl FnOnce(&Session) -> bool,
    ) -> Option<EndedSession> {
        let mut state = self.state();
        prune_ended(&mut state, self.limits.grace, Instant::now());
        if !check(state.sessions.get(session_id)?) {
            return None;
        }
        remove_session(&mut state, session_id).map(|session| {
            self.metrics.sessions_active.dec();
            EndedSession {
                session_id: session_id.to_string(),
                record_id: session.record_id.to_string(),
                notices: Vec::new(),
                local_end: local_end(&session),
                remote: session.remote,
            }
        })
    }

    /// The robot's node learns of a session whose client is on `client_node`. Refused
    /// when the robot's socket is no longer the one named, or the id is taken here.
    pub fn open_mirror(&self, mirror: &MirrorSession) -> Result<(), RelayError> {
        let mut state = self.state();
        prune_ended(&mut state, self.limits.grace, Instant::now());
        let robot_conn = match state.robots.get(&mirror.robot_id) {
            Some(conn) if **conn == *mirror.robot_conn => conn.clone(),
            _ => return Err(RelayError::RobotOffline(mirror.robot_id.clone())),
        };
        if state.sessions.contains_key(&mirror.session_id)
            || state
                .claims
                .get(&mirror.session_id)
                .is_some_and(|owner| **owner != *mirror.client_conn)
            || state
                .ended
                .get(&mirror.session_id)
                .is_some_and(|ended| *ended.subject != *mirror.subject)
        {
            return Err(RelayError::ConnectionIdInUse(mirror.session_id.clone()));
        }
        if !mirror.role.may_drive() {
            self.check_viewers(&state, &robot_conn, &mirror.robot_id, &mirror.subject)?;
        }
        let client_conn = ConnId::from(mirror.client_conn.as_str());
        let node: Arc<str> = Arc::from(mirror.client_node.as_str());
        state.ended.remove(&mirror.session_id);
        if let Some(entry) = state.conns.get_mut(&robot_conn) {
            entry.sessions.insert(mirror.session_id.clone());
        }
        state.sessions.insert(
            mirror.session_id.clone(),
            Session {
                record_id: Arc::from(mirror.record_id.as_str()),
                robot_id: mirror.robot_id.clone(),
                robot_conn,
                client_conn: client_conn.clone(),
                subject: Arc::from(mirror.subject.as_str()),
                role: mirror.role,
                remote: Some(node.clone()),
                mirror: true,
                orphaned: None,
            },
        );
        self.remote_map().insert(client_conn, node);
        self.metrics.sessions_active.inc();
        Ok(())
    }

    /// The node `origin` ended its side of a session: end ours without telling it back.
    /// Only the node holding the session's other end may end it: a node that merely used
    /// the same id (a refused offer) ends nothing here.
    pub fn end_session_from_peer(&self, session_id: &str, origin: &str) -> Option<EndedSession> {
        let mut ended = self.end_session_where(session_id, |session| {
            let ours = session.remote.as_deref() == Some(origin);
            if !ours {
                tracing::debug!(session = %session_id, node = %origin, "end from a node that holds no end of the session ignored");
            }
            ours
        })?;
        ended.remote = None;
        Some(ended)
    }

    /// Whether a frame from another node may be delivered: `from` and `to` are the two ends
    /// of `session_id` here, live or within its grace period (the last `disconnected` of a
    /// session travels after the session's end). Every node checks what it delivers
    /// against its own table, never only the sender's. Returns whose share of the
    /// receiver's queue it counts against.
    pub fn admits_frame(&self, from: &ConnId, session_id: &str, to: &ConnId) -> Option<FrameShare> {
        let state = self.state();
        let (client, robot, subject, role) = match state.sessions.get(session_id) {
            Some(s) => (&s.client_conn, &s.robot_conn, &s.subject, s.role),
            None => {
                let ended = state.ended.get(session_id)?;
                if ended.at.elapsed() >= self.limits.grace {
                    return None;
                }
                (
                    &ended.client_conn,
                    &ended.robot_conn,
                    &ended.subject,
                    ended.role,
                )
            }
        };
        if client == from && robot == to {
            Some(FrameShare {
                share: subject.clone(),
                viewer: !role.may_drive(),
            })
        } else if robot == from && client == to {
            Some(FrameShare {
                share: from.clone(),
                viewer: false,
            })
        } else {
            None
        }
    }

    /// Ends the sessions whose other end was on `node` (it died): both local ends told.
    pub fn end_sessions_with_node(&self, node: &str, cause: &str) -> Vec<EndedSession> {
        let ended = {
            let mut state = self.state();
            let ids: Vec<String> = state
                .sessions
                .iter()
                .filter(|(_, s)| s.remote.as_deref() == Some(node))
                .map(|(id, _)| id.clone())
                .collect();
            let mut ended = end_both_ways(&mut state, ids, cause);
            for session in &mut ended {
                // Nobody is left there to tell.
                session.remote = None;
            }
            ended
        };
        self.remote_map().retain(|_, n| &**n != node);
        self.metrics.sessions_active.sub(ended.len() as i64);
        ended
    }

    /// Forgets remote sockets that no session, live or in its grace period, names.
    pub fn sweep_remote(&self) {
        if self.cluster.is_none() {
            return;
        }
        // Under the state lock throughout: a session opened meanwhile keeps its entry.
        let mut state = self.state();
        prune_ended(&mut state, self.limits.grace, Instant::now());
        let named: HashSet<ConnId> = state
            .sessions
            .values()
            .flat_map(|s| [s.client_conn.clone(), s.robot_conn.clone()])
            .chain(
                state
                    .ended
                    .values()
                    .flat_map(|e| [e.client_conn.clone(), e.robot_conn.clone()]),
            )
            .collect();
        self.remote_map().retain(|conn, _| named.contains(conn));
        drop(state);
    }

    /// A session of `request.subject` whose client socket went away, taken back by the
    /// new socket `client_conn` (its offer then goes to the robot as a renegotiation).
    /// None when the session is not waiting for this subject.
    fn resume(
        &self,
        state: &mut State,
        client_conn: &ConnId,
        request: &OpenSession<'_>,
    ) -> Result<Option<ConnId>, RelayError> {
        let waiting = state.sessions.get(request.session_id).is_some_and(|s| {
            s.orphaned.is_some() && *s.subject == *request.subject && s.robot_id == request.robot_id
        });
        if !waiting {
            return Ok(None);
        }
        let limit = self.limits.sessions_per_conn;
        let Some(entry) = state.conns.get_mut(client_conn) else {
            return Ok(None);
        };
        if entry.sessions.len() >= limit || entry.claimed.len() >= limit {
            return Err(RelayError::TooManySessions { limit });
        }
        entry.sessions.insert(request.session_id.to_string());
        if request.session_id != &**client_conn {
            entry.claimed.push(request.session_id.to_string());
        }
        state
            .claims
            .insert(request.session_id.to_string(), client_conn.clone());
        let Some(session) = state.sessions.get_mut(request.session_id) else {
            return Ok(None);
        };
        session.client_conn = client_conn.clone();
        session.orphaned = None;
        tracing::info!(session = %request.session_id, subject = %request.subject, "session resumed by a new socket");
        Ok(Some(session.robot_conn.clone()))
    }

    /// Sessions whose client went away longer ago than the resume window: they end now,
    /// the robot's end to be told.
    pub fn expire_orphans(&self, now: Instant) -> Vec<EndedSession> {
        let resume = self.limits.resume;
        let mut state = self.state();
        let expired: Vec<String> = state
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.orphaned
                    .is_some_and(|at| now.saturating_duration_since(at) >= resume)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut ended = Vec::new();
        for session_id in expired {
            let Some(session) = remove_session(&mut state, &session_id) else {
                continue;
            };
            if state.claims.get(&session_id) == Some(&session.client_conn) {
                state.claims.remove(&session_id);
            }
            let notice = messages::disconnected(&session_id, None);
            ended.push(EndedSession {
                session_id,
                record_id: session.record_id.to_string(),
                notices: vec![(session.robot_conn.clone(), notice)],
                local_end: local_end(&session),
                remote: session.remote,
            });
        }
        drop(state);
        self.metrics.sessions_active.sub(ended.len() as i64);
        ended
    }

    /// Removes a socket: its sessions end; the other end of each is to be told. With a
    /// resume window, a client's own sessions wait for it instead (see `expire_orphans`),
    /// if the socket went away by itself (`resumable`): one closed for cause (a revoked or
    /// expired token, a flood) ends its sessions at once.
    pub fn detach(&self, conn: &ConnId, resumable: bool) -> Vec<EndedSession> {
        self.bus.detach(conn);
        let ended = {
            let mut state = self.state();
            let now = Instant::now();
            prune_ended(&mut state, self.limits.grace, now);
            let Some(mut entry) = state.conns.remove(conn) else {
                return Vec::new();
            };
            // With a resume window, a client's own sessions wait for it; their ids stay
            // claimed (by the gone socket) until resumed or expired.
            let mut waiting = Vec::new();
            if resumable
                && !self.limits.resume.is_zero()
                && matches!(entry.kind, ConnKind::Client { .. })
            {
                for id in &entry.sessions {
                    if let Some(session) = state.sessions.get_mut(id) {
                        // Robot on this node only: a robot's node routes by the client's
                        // socket id, which a resume changes.
                        if &session.client_conn == conn && session.remote.is_none() {
                            session.orphaned = Some(now);
                            waiting.push(id.clone());
                        }
                    }
                }
                for id in &waiting {
                    entry.sessions.remove(id);
                }
            }
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
                    if let Some(cluster) = &self.cluster {
                        cluster.presence_down(robot_id, conn);
                    }
                }
            }
            let mut ended = Vec::new();
            for session_id in entry.sessions {
                if let Some(session) = remove_session(&mut state, &session_id) {
                    let other = if &session.client_conn == conn {
                        session.robot_conn.clone()
                    } else {
                        session.client_conn.clone()
                    };
                    let notice = messages::disconnected(&session_id, None);
                    ended.push(EndedSession {
                        session_id,
                        record_id: session.record_id.to_string(),
                        notices: vec![(other, notice)],
                        local_end: local_end(&session),
                        remote: session.remote,
                    });
                }
            }
            ended
        };
        self.metrics.sessions_active.sub(ended.len() as i64);
        ended
    }

    /// Tells the remaining ends of ended sessions. An end on another node hears of it
    /// through that node, which ends its copy of the session first.
    pub fn notify(&self, ended: &[EndedSession]) {
        for session in ended {
            let mut remote_told = false;
            for (to, text) in &session.notices {
                match (&session.remote, &self.cluster) {
                    (Some(node), Some(cluster)) if self.remote_node(to).is_some() => {
                        cluster.send(
                            node,
                            &Control::End {
                                session_id: session.session_id.clone(),
                                notice: Some(text.clone()),
                            },
                        );
                        remote_told = true;
                    }
                    _ => {
                        let _ = self.deliver_local(None, to, Outbound::text(text.as_str()));
                    }
                }
            }
            if let (Some(node), Some(cluster), false) =
                (&session.remote, &self.cluster, remote_told)
            {
                cluster.send(
                    node,
                    &Control::End {
                        session_id: session.session_id.clone(),
                        notice: None,
                    },
                );
            }
        }
    }

    /// Queues a frame from `from` about `session_id`. A receiver whose whole queue is full
    /// is closed instead of growing memory; a sender over its share at the receiver is
    /// refused (the error tells the caller), the receiver left alone.
    pub fn deliver(
        &self,
        from: &ConnId,
        share: Sender<'_>,
        session_id: &str,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        if let (Some(node), Some(cluster)) = (self.remote_node(to), &self.cluster) {
            // The receiving node applies the receiver's queue limits; a sender over its
            // share there is told `relay_throttled` through its node (Control::Throttled).
            if let Outbound::Text(text) = message {
                let frame = FrameOut {
                    from: Some(from.clone()),
                    to: to.clone(),
                    session: Arc::from(session_id),
                    text,
                };
                cluster.send_frame(node, frame);
            }
            return Ok(());
        }
        self.deliver_local(Some(share), to, message)
    }

    /// Delivery to a socket of this node only (frames that came from another node).
    pub fn deliver_local(
        &self,
        from: Option<Sender<'_>>,
        to: &ConnId,
        message: Outbound,
    ) -> Result<(), DeliveryError> {
        let result = self.bus.deliver(from, to, message);
        if result == Err(DeliveryError::Full) {
            self.bus.kick(to, Kick::SlowConsumer);
        }
        result
    }

    pub fn kick(&self, conn: &ConnId, reason: Kick) {
        self.bus.kick(conn, reason);
    }

    /// A frame of `conn` was refused on another node: a strike, like a refusal here.
    pub fn strike(&self, conn: &ConnId) {
        self.bus.strike(conn);
    }

    /// Closes the robot's live connection, on whichever node it is; true if it was here.
    pub fn kick_robot(&self, robot_id: &str, reason: Kick) -> bool {
        if let Some(cluster) = &self.cluster {
            cluster.broadcast(&Control::KickRobot {
                robot_id: robot_id.to_string(),
                reason,
            });
        }
        self.kick_robot_here(robot_id, reason)
    }

    /// Closes the robot's connection if it is on this node.
    pub fn kick_robot_here(&self, robot_id: &str, reason: Kick) -> bool {
        let conn = {
            let mut state = self.state();
            state.access_cuts += 1;
            state.robots.get(robot_id).cloned()
        };
        match conn {
            Some(conn) => {
                self.bus.kick(&conn, reason);
                true
            }
            None => false,
        }
    }

    /// Closes robots whose credential is among `revoked` (e.g. serials a new CRL lists),
    /// on every node; returns how many were here.
    pub fn kick_robots_with_credentials(&self, revoked: &[String], reason: Kick) -> usize {
        if let Some(cluster) = &self.cluster {
            cluster.broadcast(&Control::KickCredentials {
                credentials: revoked.to_vec(),
                reason,
            });
        }
        self.kick_credentials_here(revoked, reason)
    }

    pub fn kick_credentials_here(&self, revoked: &[String], reason: Kick) -> usize {
        let mut state = self.state();
        state.access_cuts += 1;
        let conns: Vec<ConnId> = state
            .conns
            .iter()
            .filter(|(_, entry)| {
                matches!(&entry.kind, ConnKind::Robot { credentials, .. }
                    if credentials.iter().any(|c| revoked.contains(c)))
            })
            .map(|(conn, _)| conn.clone())
            .collect();
        drop(state);
        for conn in &conns {
            self.bus.kick(conn, reason);
        }
        conns.len()
    }

    /// Closes every connection that logged in with this opaque token, on every node;
    /// returns how many were here.
    pub fn kick_token(&self, token_id: &str) -> usize {
        if let Some(cluster) = &self.cluster {
            cluster.broadcast(&Control::KickToken {
                token_id: token_id.to_string(),
            });
        }
        self.kick_token_here(token_id)
    }

    pub fn kick_token_here(&self, token_id: &str) -> usize {
        let mut state = self.state();
        state.access_cuts += 1;
        let conns: Vec<ConnId> = state
            .conns
            .iter()
            .filter(|(_, entry)| {
                matches!(&entry.kind, ConnKind::Client { token_id: Some(t) } if t == token_id)
            })
            .map(|(conn, _)| conn.clone())
            .collect();
        drop(state);
        for conn in &conns {
            self.bus.kick(conn, Kick::TokenRevoked);
        }
        conns.len()
    }

    /// Ends the sessions `subject` has with `robot_id` whose role is above `allowed` (all
    /// of them when `allowed` is None: the grant was withdrawn). Both ends are to be told,
    /// with `cause` as the notice's reason.
    pub fn end_sessions_of(
        &self,
        robot_id: &str,
        subject: &str,
        allowed: Option<Role>,
        cause: &str,
        scope: GrantScope,
    ) -> Vec<EndedSession> {
        let ended = {
            let mut state = self.state();
            state.access_cuts += 1;
            let ids: Vec<String> = state
                .sessions
                .iter()
                .filter(|(_, s)| scope.covers(s))
                .filter(|(_, s)| s.robot_id == robot_id && &*s.subject == subject)
                .filter(|(_, s)| allowed.is_none_or(|role| s.role > role))
                .map(|(id, _)| id.clone())
                .collect();
            end_both_ways(&mut state, ids, cause)
        };
        self.metrics.sessions_active.sub(ended.len() as i64);
        ended
    }

    /// Ends every session (shutdown); both ends of each are to be told.
    pub fn end_all(&self, cause: &str) -> Vec<EndedSession> {
        let ended = {
            let mut state = self.state();
            let ids: Vec<String> = state.sessions.keys().cloned().collect();
            end_both_ways(&mut state, ids, cause)
        };
        self.metrics.sessions_active.sub(ended.len() as i64);
        ended
    }

    /// Asks every socket to close; returns how many were asked.
    pub fn close_all(&self, reason: Kick) -> usize {
        let conns: Vec<ConnId> = self.state().conns.keys().cloned().collect();
        for conn in &conns {
            self.bus.kick(conn, reason);
        }
        conns.len()
    }

    pub fn connection_count(&self) -> usize {
        self.state().conns.len()
    }
}

/// Removes the sessions `ids`, with a notice to both ends of each.
fn end_both_ways(state: &mut State, ids: Vec<String>, cause: &str) -> Vec<EndedSession> {
    ids.into_iter()
        .filter_map(|id| {
            let session = remove_session(state, &id)?;
            let text = messages::disconnected(&id, Some(cause));
            Some(EndedSession {
                session_id: id,
                record_id: session.record_id.to_string(),
                local_end: local_end(&session),
                notices: vec![
                    (session.client_conn, text.clone()),
                    (session.robot_conn, text),
                ],
                remote: session.remote,
            })
        })
        .collect()
}

fn local_end(session: &Session) -> Option<ConnId> {
    match (&session.remote, session.mirror) {
        (None, _) => None,
        (Some(_), true) => Some(session.robot_conn.clone()),
        (Some(_), false) => Some(session.client_conn.clone()),
    }
}

/// Forgets sessions whose grace period is over, and releases their ids.
fn prune_ended(state: &mut State, grace: Duration, now: Instant) {
    while let Some((at, _)) = state.ended_order.front() {
        if now.saturating_duration_since(*at) < grace {
            break;
        }
        let Some((_, id)) = state.ended_order.pop_front() else {
            break;
        };
        // A session reopened under this id has its own life; only a forgotten one frees it.
        if state.sessions.contains_key(&id) || state.ended.remove(&id).is_none() {
            continue;
        }
        if let Some(owner) = state.claims.get(&id).cloned() {
            if &*owner != id.as_str() {
                state.claims.remove(&id);
                if let Some(entry) = state.conns.get_mut(&owner) {
                    entry.claimed.retain(|claimed| *claimed != id);
                }
            }
        }
    }
}

fn remove_session(state: &mut State, session_id: &str) -> Option<Session> {
    let session = state.sessions.remove(session_id)?;
    let now = Instant::now();
    state.ended.insert(
        session_id.to_string(),
        Ended {
            client_conn: session.client_conn.clone(),
            robot_conn: session.robot_conn.clone(),
            subject: session.subject.clone(),
            role: session.role,
            at: now,
        },
    );
    state.ended_order.push_back((now, session_id.to_string()));
    for conn in [&session.client_conn, &session.robot_conn] {
        if let Some(entry) = state.conns.get_mut(conn) {
            entry.sessions.remove(session_id);
        }
    }
    Some(session)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::{LocalBus, MailboxReceiver, QueueLimits};

    fn hub() -> Hub {
        Hub::new(
            Arc::new(LocalBus::default()),
            Metrics::new(),
            HubLimits::default(),
        )
    }

    fn connect(hub: &Hub, id: &str) -> (ConnId, MailboxReceiver) {
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
        }
    }

    fn open<'a>(session_id: &'a str, role: Role) -> OpenSession<'a> {
        OpenSession {
            session_id,
            robot_id: "r1",
            subject: "alice",
            role,
            offer_id: "offer-1",
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
        let cuts: [&dyn Fn(&Hub); 5] = [
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
        let ended = hub.end_session_from_peer("s1", "node-b").unwrap();
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
        assert!(hub.admits_frame(&alice_on_b, "s1", &robot).is_some());
        assert!(hub.admits_frame(&robot, "s1", &alice_on_b).is_some());
        assert!(hub
            .admits_frame(&ConnId::from("client-on-c"), "s1", &robot)
            .is_none());
        assert!(hub.admits_frame(&alice_on_b, "s2", &robot).is_none());
        // Only the node of its other end may end it.
        assert!(hub.end_session_from_peer("s1", "node-c").is_none());
        assert!(hub.route(&robot, "s1").is_ok());
        hub.end_session_from_peer("s1", "node-b").unwrap();
        // Ended: its last messages still cross; the id stays alice's for the grace period.
        assert!(hub.admits_frame(&alice_on_b, "s1", &robot).is_some());
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
        let hub = Hub::new(
            Arc::new(LocalBus::default()),
            Metrics::new(),
            HubLimits {
                viewers_per_subject: 2,
                viewers_per_robot: 3,
                ..HubLimits::default()
            },
        );
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
