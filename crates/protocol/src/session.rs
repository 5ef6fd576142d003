//! The server→robot session contract: who is on the other end of a session
//! and what they may do. The server stamps it as `meta.session =
//! {subject, role}` on every message it forwards to a robot; the robot
//! decides from it whether the session may move the machine.
//!
//! `meta` is outside the spec's semantics (the envelope allows any object
//! there), so this shape is ours; keeping it in this crate means the server
//! that writes it and the agent that reads it cannot drift apart.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Key of the session object inside an envelope's `meta`.
pub const SESSION_META_KEY: &str = "session";

/// Key of the ticket inside `meta.session` (also `ticket::TICKET_META_KEY`).
pub const TICKET_META_KEY: &str = "ticket";

/// What a subject may do with a robot. Stored as lowercase text (grants
/// table, admin API) and sent in `meta.session.role`. Ordered by privilege
/// (viewer < operator < owner): a grant lowered below a live session's role
/// ends that session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Owner,
}

impl Role {
    /// The wire and storage spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Owner => "owner",
        }
    }

    /// Strict parse: `None` for anything but the three spellings. For the
    /// server, where an unknown role is an error (bad input, corrupt row).
    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "owner" => Some(Role::Owner),
            _ => None,
        }
    }

    /// Lenient parse for a receiver that must act on whatever arrives:
    /// anything missing or unknown is a viewer, because least privilege is
    /// the only safe default for a machine that moves.
    pub fn parse_or_viewer(text: Option<&str>) -> Role {
        text.and_then(Role::parse).unwrap_or(Role::Viewer)
    }

    /// Roles that may drive the robot (and so hold its single control lock
    /// on the server).
    pub fn may_drive(self) -> bool {
        matches!(self, Role::Operator | Role::Owner)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `meta.session`: the authenticated subject of a session and its role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMeta {
    pub subject: String,
    pub role: Role,
    /// The server's signed ticket for this message (`meta.session.ticket`, see
    /// [`crate::ticket`]); `None` from a server that signs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
}

impl SessionMeta {
    pub fn new(subject: impl Into<String>, role: Role) -> SessionMeta {
        SessionMeta {
            subject: subject.into(),
            role,
            ticket: None,
        }
    }

    /// The same, with the server's signed ticket.
    pub fn with_ticket(mut self, ticket: impl Into<String>) -> SessionMeta {
        self.ticket = Some(ticket.into());
        self
    }

    /// The whole `meta` object a forwarded message carries:
    /// `{"session": {"subject": …, "role": …}}` (and `"ticket": …` when signed).
    pub fn to_meta(&self) -> Map<String, Value> {
        let mut session = Map::new();
        session.insert("subject".into(), Value::String(self.subject.clone()));
        session.insert("role".into(), Value::String(self.role.as_str().into()));
        if let Some(ticket) = &self.ticket {
            session.insert(TICKET_META_KEY.into(), Value::String(ticket.clone()));
        }
        let mut meta = Map::new();
        meta.insert(SESSION_META_KEY.into(), Value::Object(session));
        meta
    }

    /// Reads `meta.session` on the robot's side, leniently: no session
    /// object or no string subject gives `None`; an unknown or missing role
    /// is a viewer (see [`Role::parse_or_viewer`]). Never fails, because a
    /// robot must not be stopped from answering by an odd `meta`; it only
    /// ever loses privilege from it.
    pub fn from_meta(meta: Option<&Map<String, Value>>) -> Option<SessionMeta> {
        let session = meta?.get(SESSION_META_KEY)?.as_object()?;
        let subject = session.get("subject")?.as_str()?.to_owned();
        let role = Role::parse_or_viewer(session.get("role").and_then(Value::as_str));
        let ticket = session
            .get(TICKET_META_KEY)
            .and_then(Value::as_str)
            .map(str::to_owned);
        Some(SessionMeta {
            subject,
            role,
            ticket,
        })
    }

    /// The role a receiver should grant for `meta`: a viewer unless the
    /// server vouched for more.
    pub fn role_of(meta: Option<&Map<String, Value>>) -> Role {
        SessionMeta::from_meta(meta).map_or(Role::Viewer, |s| s.role)
    }
}
