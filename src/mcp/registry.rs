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

/// What a request hands its session's task.
pub enum Input {
    /// A request of the client: its answer comes back on `answer`.
    Request {
        id: Value,
        object: Map<String, Value>,
        answer: oneshot::Sender<String>,
    },
    /// A notification or a response of the client: nothing comes back.
    Message(Map<String, Value>),
    /// A `GET` stream for what the server sends unasked (a newer one replaces it).
    Stream(mpsc::Sender<String>),
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
