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
//!   sockets here ([`crate::delivery`]); cluster routing wraps it and reaches other nodes
//!   through [`crate::cluster`];
//! - `peers`: what other nodes tell this one, applied here.

mod error;
mod hub;
mod peers;
mod presence;
mod routing;
mod sessions;
mod table;

use std::sync::Arc;

pub use crate::delivery::{
    Bus, ConnId, DeliveryError, Kick, KickReceiver, LocalBus, Mailbox, MailboxReceiver, Outbound,
    QueueLimits, QueueReceiver, Sender,
};
pub use crate::messages::ViewerCap;
pub use error::{RelayError, SessionError};
pub use peers::Peers;
pub use presence::{LoggedInWith, Presence, RobotDeclared, RobotVerified};
pub use sessions::{EndReason, Sessions};
pub use table::{
    EndedSession, FrameShare, GrantScope, HubLimits, OpenSession, Route, SessionOpened,
};

use crate::cluster::Cluster;
use crate::metrics::Metrics;
use crate::store::Store;

/// Builds the relay of a node: its two doors over one hub, routing to other nodes through
/// `cluster` when there is one.
pub fn build(
    limits: HubLimits,
    metrics: Metrics,
    cluster: Option<Arc<Cluster>>,
    store: Store,
    node_id: String,
) -> (Presence, Sessions) {
    let bus: Arc<dyn Bus> = Arc::new(LocalBus::default());
    let router = match cluster {
        Some(cluster) => routing::Router::clustered(bus, cluster),
        None => routing::Router::local(bus),
    };
    let hub = Arc::new(hub::Hub::new(router, metrics, limits));
    (
        Presence::new(hub.clone()),
        Sessions::new(hub, store, node_id),
    )
}
