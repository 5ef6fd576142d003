//! The relay: who is online, which sessions exist, and delivery of messages between the two
//! ends of a session.
//!
//! Two doors, and nothing else is public: [`Presence`] (sockets, robots online, closing
//! sockets by robot, credential or token) and [`Sessions`] (a session's life: open, record,
//! end and notices, always in that order; routing of its messages). Behind them:
//! - `hub`: presence and the session table under one lock;
//! - `table`: the session table itself (grace period, resume, mirrors of other nodes'
//!   sessions), plain data with no I/O;
//! - `routing`: the seam between this node and the others. Local routing delivers to
//!   sockets here ([`crate::delivery`]); cluster routing wraps it, reaches other nodes
//!   through [`crate::cluster`], applies what they tell this one and owns the node's life
//!   among them (lease, locks, dead nodes; [`workers`] for the server to run).

mod error;
mod hub;
mod presence;
mod routing;
mod sessions;
mod table;

use std::sync::Arc;

pub use crate::delivery::{
    Bus, CloseRequest, ConnId, DeliveryError, Kick, KickReceiver, LocalBus, Mailbox,
    MailboxReceiver, Outbound, QueueLimits, QueueReceiver, Sender, WriterNext,
};
pub use crate::messages::ViewerCap;
pub use error::{RelayError, SessionError};
pub use presence::{LoggedInWith, Presence, RobotDeclared, RobotVerified};
pub use routing::lifecycle::LoginCheck;
pub use routing::workers::{workers, Worker};
pub use routing::{PresenceWritten, Router};
pub use sessions::{EndReason, Sessions};
pub use table::{
    EndedSession, FrameShare, GrantScope, HubLimits, OpenSession, Route, SessionOpened,
};

use crate::metrics::Metrics;
use crate::store::Store;

/// Builds the relay of a node: its two doors over one hub and `router`.
pub fn build(
    limits: HubLimits,
    metrics: Metrics,
    router: Router,
    store: Store,
    node_id: String,
) -> (Presence, Sessions) {
    let hub = Arc::new(hub::Hub::new(router, metrics, limits));
    (
        Presence::new(hub.clone()),
        Sessions::new(hub, store, node_id),
    )
}
