//! The session table: which sessions exist, who may use a session id, the grace period in
//! which an ended session is still remembered, sessions waiting for their client to come
//! back (resume), and copies of sessions owned by other nodes (mirrors). Plain data with no
//! I/O: the hub holds it behind one lock and acts on what these methods return.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod checks;
mod ending;
mod mirror;
mod route;

pub use ending::EndedSession;

use super::RelayError;
use crate::delivery::{ConnId, Sender};
use crate::messages::{SessionKind, ViewerCap};
use crate::store::Role;

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
pub(in crate::relay) enum ConnKind {
    Pending,
    /// A verified robot and the revocation entries of the credential it proved.
    Robot {
        robot_id: String,
        credentials: Vec<String>,
        /// It declared ARP when it registered (`register.metadata.arp`).
        serves_arp: bool,
        /// It takes ticket renewals (`register.metadata.sessionTickets`).
        renews_tickets: bool,
    },
    Client {
        token_id: Option<String>,
    },
}

/// A socket of this node: what it is, its sessions and the ids it claimed.
pub(in crate::relay) struct ConnEntry {
    pub(in crate::relay) kind: ConnKind,
    pub(in crate::relay) sessions: HashSet<String>,
    /// Session ids claimed besides its own connection id, live or within the grace period
    /// (at most the per-socket session limit): what its detach must release.
    pub(in crate::relay) claimed: Vec<String>,
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

/// A live session whose ticket is due for renewal (see [`State::tickets_to_renew`]).
#[derive(Debug, Clone)]
pub struct TicketRenewal {
    pub robot_conn: ConnId,
    pub robot_id: String,
    pub session_id: String,
    pub subject: Arc<str>,
    pub role: Role,
}

#[derive(Debug, Clone)]
pub(super) struct Session {
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
    kind: SessionKind,
}

/// Presence and sessions under one lock: a socket's sessions and claims change with the
/// table, and a detach must see both at once.
pub(super) struct State {
    pub(super) limits: HubLimits,
    pub(super) conns: HashMap<ConnId, ConnEntry>,
    pub(super) robots: HashMap<String, ConnId>,
    sessions: HashMap<String, Session>,
    /// Session ids (connectionIds) and the socket that owns each: the first that used it.
    pub(super) claims: HashMap<String, ConnId>,
    /// Sessions that ended within the grace period, and their end times in order.
    ended: HashMap<String, Ended>,
    ended_order: VecDeque<(Instant, String)>,
    /// Counts cuts of access (a robot's revocation, re-enrollment or deletion, a token's
    /// revocation, a grant withdrawn or lowered, a lapse re-check), so a login or an offer
    /// can tell whether one came between its database check and its registration here
    /// (see [`super::Presence::access_cuts`]).
    pub(super) access_cuts: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct OpenSession<'a> {
    pub session_id: &'a str,
    pub robot_id: &'a str,
    pub subject: &'a str,
    pub role: Role,
    /// The offer's message id (a refusal from another node names it).
    pub offer_id: &'a str,
    pub kind: SessionKind,
}

#[derive(Debug)]
pub enum SessionOpened {
    /// A new session: its record must be written, then the offer forwarded.
    New {
        record_id: String,
        robot_conn: ConnId,
        /// The robot's node, when it is not this one.
        remote: Option<Arc<str>>,
    },
    /// A renegotiation offer within an existing session of this client.
    Existing { robot_conn: ConnId },
}

/// Whose share of its receiver's queue a frame from another node counts against (see
/// [`crate::delivery::Sender`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameShare {
    pub share: Arc<str>,
    pub viewer: bool,
    /// The session has ended here (the frame is within its grace period): only its last
    /// `disconnected` still goes through.
    pub ended: bool,
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
    pub kind: SessionKind,
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

impl State {
    pub(super) fn new(limits: HubLimits) -> State {
        State {
            limits,
            conns: HashMap::new(),
            robots: HashMap::new(),
            sessions: HashMap::new(),
            claims: HashMap::new(),
            ended: HashMap::new(),
            ended_order: VecDeque::new(),
            access_cuts: 0,
        }
    }

    /// Checks the session rules and reserves the session before its record is written;
    /// `elsewhere` is the robot's socket on another node, when it is not here.
    pub(super) fn open(
        &mut self,
        client_conn: &ConnId,
        request: OpenSession<'_>,
        elsewhere: Option<(ConnId, Arc<str>)>,
    ) -> Result<SessionOpened, RelayError> {
        self.prune_ended(Instant::now());
        if let Some(robot_conn) = self.resume(client_conn, &request)? {
            return Ok(SessionOpened::Existing { robot_conn });
        }
        let claimed_already = match self.claims.get(request.session_id) {
            Some(owner) if owner != client_conn => {
                return Err(RelayError::ConnectionIdInUse(
                    request.session_id.to_string(),
                ))
            }
            Some(_) => true,
            None => false,
        };
        if let Some(existing) = self.sessions.get(request.session_id) {
            return existing.renegotiated_by(client_conn, &request);
        }
        if self.ended_for_another(request.session_id, request.subject) {
            return Err(RelayError::ConnectionIdInUse(
                request.session_id.to_string(),
            ));
        }
        self.check_session_count(client_conn, claimed_already)?;
        let (robot_conn, remote) = match (self.robots.get(request.robot_id), elsewhere) {
            (Some(conn), _) => (conn.clone(), None),
            (None, Some((conn, node))) => (conn, Some(node)),
            (None, None) => return Err(RelayError::RobotOffline(request.robot_id.to_string())),
        };
        if request.kind == SessionKind::Arp && !self.serves_arp(&robot_conn, &remote) {
            return Err(RelayError::ArpUnsupported(request.robot_id.to_string()));
        }
        if request.role.may_drive() {
            self.check_control(&robot_conn, &request)?;
        } else {
            self.check_viewers(&robot_conn, request.robot_id, request.subject)?;
        }
        let record_id = uuid::Uuid::new_v4().to_string();
        if !claimed_already {
            self.claim(request.session_id, client_conn);
        }
        self.insert(
            request.session_id,
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
                kind: request.kind,
            },
        );
        Ok(SessionOpened::New {
            record_id,
            robot_conn,
            remote,
        })
    }

    /// Whether `session_id` is still the session whose record is `record_id` (it did not end,
    /// nor was its id taken again, while its opener awaited the lock and the record).
    pub(super) fn is_open(&self, session_id: &str, record_id: &str) -> bool {
        self.sessions
            .get(session_id)
            .is_some_and(|s| *s.record_id == *record_id)
    }

    /// Whether the robot on `robot_conn` declared ARP. A robot on another node (`remote`)
    /// is checked by its own node, which refuses the session's mirror.
    fn serves_arp(&self, robot_conn: &ConnId, remote: &Option<Arc<str>>) -> bool {
        if remote.is_some() {
            return true;
        }
        self.conns.get(robot_conn).is_some_and(
            |entry| matches!(entry.kind, ConnKind::Robot { serves_arp, .. } if serves_arp),
        )
    }

    /// The live teleop sessions whose robot is on this node and takes ticket renewals:
    /// each needs a fresh ticket before its last one runs out.
    pub(super) fn tickets_to_renew(&self) -> Vec<TicketRenewal> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.kind == SessionKind::Teleop)
            .filter(|(_, s)| {
                self.conns.get(&s.robot_conn).is_some_and(|entry| {
                    matches!(
                        entry.kind,
                        ConnKind::Robot {
                            renews_tickets: true,
                            ..
                        }
                    )
                })
            })
            .map(|(id, s)| TicketRenewal {
                robot_conn: s.robot_conn.clone(),
                robot_id: s.robot_id.clone(),
                session_id: id.clone(),
                subject: s.subject.clone(),
                role: s.role,
            })
            .collect()
    }

    fn claim(&mut self, session_id: &str, conn: &ConnId) {
        self.claims.insert(session_id.to_string(), conn.clone());
        if let Some(entry) = self.conns.get_mut(conn) {
            entry.claimed.push(session_id.to_string());
        }
    }

    /// Adds a session to the table and to its ends' entries.
    fn insert(&mut self, session_id: &str, session: Session) {
        // Reopened under the same id: late messages now belong to the new session.
        self.ended.remove(session_id);
        // A mirror's client is a socket of another node: only the robot's end is here.
        let ends = if session.mirror {
            vec![&session.robot_conn]
        } else {
            vec![&session.client_conn, &session.robot_conn]
        };
        for conn in ends {
            if let Some(entry) = self.conns.get_mut(conn) {
                entry.sessions.insert(session_id.to_string());
            }
        }
        self.sessions.insert(session_id.to_string(), session);
    }

    /// A session of `request.subject` whose client socket went away, taken back by the
    /// new socket `client_conn` (its offer then goes to the robot as a renegotiation).
    /// None when the session is not waiting for this subject.
    fn resume(
        &mut self,
        client_conn: &ConnId,
        request: &OpenSession<'_>,
    ) -> Result<Option<ConnId>, RelayError> {
        let waiting = self.sessions.get(request.session_id).is_some_and(|s| {
            s.orphaned.is_some() && *s.subject == *request.subject && s.robot_id == request.robot_id
        });
        if !waiting {
            return Ok(None);
        }
        let limit = self.limits.sessions_per_conn;
        let Some(entry) = self.conns.get_mut(client_conn) else {
            return Ok(None);
        };
        if entry.sessions.len() >= limit || entry.claimed.len() >= limit {
            return Err(RelayError::TooManySessions { limit });
        }
        entry.sessions.insert(request.session_id.to_string());
        if request.session_id != &**client_conn {
            entry.claimed.push(request.session_id.to_string());
        }
        self.claims
            .insert(request.session_id.to_string(), client_conn.clone());
        let Some(session) = self.sessions.get_mut(request.session_id) else {
            return Ok(None);
        };
        session.client_conn = client_conn.clone();
        session.orphaned = None;
        tracing::info!(session = %request.session_id, subject = %request.subject, "session resumed by a new socket");
        Ok(Some(session.robot_conn.clone()))
    }

    fn ids_where(&self, keep: impl Fn(&Session) -> bool) -> Vec<String> {
        self.sessions
            .iter()
            .filter(|(_, s)| keep(s))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Each (robot, subject) with sessions in `scope`, and the highest role among them.
    pub(super) fn session_roles(&self, scope: GrantScope) -> Vec<(String, Arc<str>, Role)> {
        let mut highest: HashMap<(&str, &Arc<str>), Role> = HashMap::new();
        for session in self.sessions.values().filter(|s| scope.covers(s)) {
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
}

impl Session {
    /// A second offer under a live session's id: the same client renegotiating, or refused.
    /// A session whose client is on another node is not claimed here: the id is still that
    /// client's, cluster-wide.
    fn renegotiated_by(
        &self,
        client_conn: &ConnId,
        request: &OpenSession<'_>,
    ) -> Result<SessionOpened, RelayError> {
        if self.client_conn != *client_conn {
            return Err(RelayError::ConnectionIdInUse(
                request.session_id.to_string(),
            ));
        }
        if self.robot_id != request.robot_id {
            return Err(RelayError::SessionRobotMismatch(
                request.session_id.to_string(),
            ));
        }
        Ok(SessionOpened::Existing {
            robot_conn: self.robot_conn.clone(),
        })
    }

    /// The node of the end that is not here, if any.
    pub(super) fn remote(&self) -> Option<&str> {
        self.remote.as_deref()
    }
}
