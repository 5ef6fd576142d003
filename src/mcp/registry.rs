//! The MCP sessions of this node, by `Mcp-Session-Id`: what a request needs to reach its
//! session (whose it is, the channel into its task), and the bounds on how many exist.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

/// Sessions one subject may hold at once on this node.
pub const PER_SUBJECT: usize = 16;
/// Messages a session may have queued for its task at once; more are refused (429).
pub const QUEUED: usize = 64;

/// One SSE event of a session: its id (`<stream>-<sequence>`, for `Last-Event-ID`) and one
/// JSON-RPC message.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: String,
    pub line: String,
}

/// Where a request's answer goes.
pub enum Answer {
    /// The answer alone, as `application/json`.
    Json(oneshot::Sender<String>),
    /// An SSE stream of its own: the messages related to the request, then its answer, and
    /// the stream ends.
    Events(mpsc::Sender<Event>),
}

/// What a request hands its session's task.
pub enum Input {
    /// A request of the client: its answer comes back on `answer`.
    Request {
        id: Value,
        object: Map<String, Value>,
        answer: Answer,
    },
    /// A notification or a response of the client: nothing comes back.
    Message(Map<String, Value>),
    /// A `GET` stream: with no `Last-Event-ID`, for what the server sends unasked (a newer
    /// one replaces it); with one, it resumes the stream that event was on, replaying what
    /// came after it.
    Stream {
        events: mpsc::Sender<Event>,
        last_event_id: Option<String>,
    },
}

/// A live session, as requests see it.
pub struct Handle {
    pub subject: String,
    pub robot_id: String,
    pub inputs: mpsc::Sender<Input>,
}

#[derive(Default)]
pub struct Registry {
    sessions: Mutex<HashMap<String, Arc<Handle>>>,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Handle>>> {
        // Each update is one insert or remove: nothing half done to protect.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `subject` may open one more session.
    pub fn has_room(&self, subject: &str) -> bool {
        self.map().values().filter(|h| h.subject == subject).count() < PER_SUBJECT
    }

    pub fn insert(&self, id: String, handle: Arc<Handle>) {
        self.map().insert(id, handle);
    }

    pub fn get(&self, id: &str) -> Option<Arc<Handle>> {
        self.map().get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Handle>> {
        self.map().remove(id)
    }
}
