//! Presence: the sockets of this node, which of them are verified robots and clients, and
//! closing them by robot, credential or token, on this node and (through the router) on
//! every other. [`Presence`] is the door for the WebSocket code, the API and the cluster.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::hub::Hub;
use super::routing::{Cut, PresenceWritten};
use super::table::{ConnEntry, ConnKind};
use crate::delivery::{ConnId, Kick, Mailbox, Outbound};

/// How a socket proved who it is, for checking it again (see [`Presence::local_logins`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoggedInWith {
    Robot {
        robot_id: String,
        credentials: Vec<String>,
    },
    Token(String),
}

/// What a robot said it speaks when it registered (`register.metadata`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RobotDeclared {
    /// ARP through the gateway (`arp`).
    pub arp: bool,
    /// Renewals of its sessions' tickets (`sessionTickets`).
    pub session_tickets: bool,
}

/// A robot registered by [`Presence::robot_verified`].
#[derive(Debug)]
pub struct RobotVerified {
    /// Resolves once the robot's presence is in the cluster's directory (with a cluster).
    pub presence: Option<PresenceWritten>,
    /// A cut of access happened since the login read [`Presence::access_cuts`].
    pub cut_since: bool,
}

/// Who is connected here, and closing sockets.
#[derive(Clone)]
pub struct Presence {
    hub: Arc<Hub>,
}

impl Presence {
    pub(super) fn new(hub: Arc<Hub>) -> Presence {
        Presence { hub }
    }

    /// Registers a new socket; its own connection id is claimed for it from the start, so
    /// nobody else can open a session under it.
    pub fn attach(&self, conn: ConnId, mailbox: Mailbox) {
        self.hub.router.attach(conn.clone(), mailbox);
        let mut state = self.hub.state();
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
    /// check): the token must then be checked again, as in [`Presence::robot_verified`].
    pub fn set_client(&self, conn: &ConnId, token_id: Option<String>, cuts_seen: u64) -> bool {
        let mut state = self.hub.state();
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
    /// checks again ([`Presence::robot_verified`], [`Presence::set_client`], the offer).
    pub fn access_cuts(&self) -> u64 {
        self.hub.state().access_cuts
    }

    /// A cut is on its way that does not come through the kicks here (the re-check after a
    /// bus lapse): logins and offers checked before it must check again.
    pub fn note_access_cut(&self) {
        self.hub.state().access_cuts += 1;
    }

    /// Marks the socket as the verified connection of `robot_id`; an older connection of the
    /// same robot is closed. In a cluster, the answer's `presence` resolves once every node
    /// can find the robot (see [`super::Router::presence_up`]).
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
        declared: RobotDeclared,
        cuts_seen: u64,
    ) -> RobotVerified {
        let (replaced, cut_since) = {
            let mut state = self.hub.state();
            let cut_since = state.access_cuts != cuts_seen;
            if let Some(entry) = state.conns.get_mut(conn) {
                entry.kind = ConnKind::Robot {
                    robot_id: robot_id.to_string(),
                    credentials,
                    serves_arp: declared.arp,
                    renews_tickets: declared.session_tickets,
                };
            }
            (
                state.robots.insert(robot_id.to_string(), conn.clone()),
                cut_since,
            )
        };
        match replaced {
            Some(old) if &old != conn => self.hub.router.kick_here(&old, Kick::Replaced),
            Some(_) => {}
            None => self.hub.metrics.robots_online.inc(),
        }
        RobotVerified {
            presence: self.hub.router.presence_up(robot_id, conn),
            cut_since,
        }
    }

    /// What each verified socket here logged in with: robots with the revocation entries
    /// of their credential, clients with their opaque token (JWT clients have none to check).
    pub fn local_logins(&self) -> Vec<(ConnId, LoggedInWith)> {
        self.hub
            .state()
            .conns
            .iter()
            .filter_map(|(conn, entry)| {
                let login = match &entry.kind {
                    ConnKind::Robot {
                        robot_id,
                        credentials,
                        ..
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

    /// The robots connected to this node and their sockets.
    pub fn local_robots(&self) -> Vec<(String, ConnId)> {
        self.hub
            .state()
            .robots
            .iter()
            .map(|(id, conn)| (id.clone(), conn.clone()))
            .collect()
    }

    /// Whether `conn` is a verified robot's socket on this node.
    pub fn is_robot(&self, conn: &ConnId) -> bool {
        self.hub
            .state()
            .conns
            .get(conn)
            .is_some_and(|entry| matches!(entry.kind, ConnKind::Robot { .. }))
    }

    pub fn is_online(&self, robot_id: &str) -> bool {
        self.hub.state().robots.contains_key(robot_id)
    }

    /// The node each of these robots is connected to, when online: this one (`this_node`),
    /// or another whose heartbeat lease is alive (multi-node).
    pub async fn where_online(&self, ids: &[&str], this_node: &str) -> HashMap<String, String> {
        let mut nodes = self.hub.router.nodes_of(ids).await;
        for id in ids {
            if self.is_online(id) {
                nodes.insert(id.to_string(), this_node.to_string());
            }
        }
        nodes
    }

    pub fn robots_online(&self) -> usize {
        self.hub.state().robots.len()
    }

    pub fn connection_count(&self) -> usize {
        self.hub.state().conns.len()
    }

    /// Closes a socket of this node.
    pub fn kick(&self, conn: &ConnId, reason: Kick) {
        self.hub.router.kick_here(conn, reason);
    }

    /// A frame of `conn` was refused on another node: a strike, like a refusal here.
    pub fn strike(&self, conn: &ConnId) {
        self.hub.router.strike(conn);
    }

    /// Closes the robot's live connection, on whichever node it is; true if it was here.
    pub fn kick_robot(&self, robot_id: &str, reason: Kick) -> bool {
        self.hub.router.announce(Cut::Robot {
            robot_id: robot_id.to_string(),
            reason,
        });
        self.kick_robot_here(robot_id, reason)
    }

    /// Closes the robot's connection if it is on this node.
    pub fn kick_robot_here(&self, robot_id: &str, reason: Kick) -> bool {
        let conn = {
            let mut state = self.hub.state();
            state.access_cuts += 1;
            state.robots.get(robot_id).cloned()
        };
        match conn {
            Some(conn) => {
                self.hub.router.kick_here(&conn, reason);
                true
            }
            None => false,
        }
    }

    /// Closes robots whose credential is among `revoked` (e.g. serials a new CRL lists),
    /// on every node; returns how many were here.
    pub fn kick_robots_with_credentials(&self, revoked: &[String], reason: Kick) -> usize {
        self.hub.router.announce(Cut::Credentials {
            credentials: revoked.to_vec(),
            reason,
        });
        self.kick_credentials_here(revoked, reason)
    }

    pub fn kick_credentials_here(&self, revoked: &[String], reason: Kick) -> usize {
        self.kick_here_where(reason, |kind| {
            matches!(kind, ConnKind::Robot { credentials, .. }
                if credentials.iter().any(|c| revoked.contains(c)))
        })
    }

    /// Closes every connection that logged in with this opaque token, on every node;
    /// returns how many were here.
    pub fn kick_token(&self, token_id: &str) -> usize {
        self.hub.router.announce(Cut::Token {
            token_id: token_id.to_string(),
        });
        self.kick_token_here(token_id)
    }

    pub fn kick_token_here(&self, token_id: &str) -> usize {
        self.kick_here_where(
            Kick::TokenRevoked,
            |kind| matches!(kind, ConnKind::Client { token_id: Some(t) } if t == token_id),
        )
    }

    /// A cut of access: closes the sockets here whose login `matches`.
    fn kick_here_where(&self, reason: Kick, matches: impl Fn(&ConnKind) -> bool) -> usize {
        let conns: Vec<ConnId> = {
            let mut state = self.hub.state();
            state.access_cuts += 1;
            state
                .conns
                .iter()
                .filter(|(_, entry)| matches(&entry.kind))
                .map(|(conn, _)| conn.clone())
                .collect()
        };
        for conn in &conns {
            self.hub.router.kick_here(conn, reason);
        }
        conns.len()
    }

    /// E-stops the robot through its ARP server, on whichever node it is; true if it is
    /// here and serves ARP (another node that has it does the same).
    pub fn emergency_stop(&self, robot_id: &str, subject: &str) -> bool {
        self.hub.router.announce(Cut::EmergencyStop {
            robot_id: robot_id.to_string(),
            subject: subject.to_string(),
        });
        self.emergency_stop_here(robot_id, subject)
    }

    /// E-stops the robot if it is connected here and declared ARP.
    pub fn emergency_stop_here(&self, robot_id: &str, subject: &str) -> bool {
        let robot = {
            let state = self.hub.state();
            state.robots.get(robot_id).cloned().filter(|conn| {
                state.conns.get(conn).is_some_and(|entry| {
                    matches!(
                        entry.kind,
                        ConnKind::Robot {
                            serves_arp: true,
                            ..
                        }
                    )
                })
            })
        };
        let Some(robot) = robot else {
            return false;
        };
        tracing::warn!(robot = %robot_id, by = %subject, "emergency stop from the API");
        for text in crate::messages::arp_emergency_stop(subject) {
            // Past every queue limit: a stop must not wait behind a sender's share.
            let _ = self
                .hub
                .router
                .deliver_here(None, &robot, Outbound::text(text));
        }
        true
    }

    /// Asks every socket to close; returns how many were asked.
    pub fn close_all(&self, reason: Kick) -> usize {
        let conns: Vec<ConnId> = self.hub.state().conns.keys().cloned().collect();
        for conn in &conns {
            self.hub.router.kick_here(conn, reason);
        }
        conns.len()
    }
}
