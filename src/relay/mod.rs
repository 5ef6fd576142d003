//! The relay: who is online, which sessions exist, and delivery of messages between the two
//! ends of a session.
//!
//! [`Sessions`] owns a session's life: open, record, end and notices, always in that
//! order. `Hub` holds presence and the session table (plain data behind a
//! `std::sync::Mutex`, never held across an await); `Bus` is the delivery interface. The
//! in-process `LocalBus` hands messages to socket queues on this node; a multi-node bus
//! (e.g. Redis pub/sub) implements the same trait without touching the WebSocket code.

mod bus;
mod hub;
mod sessions;

pub use bus::{
    Bus, ConnId, DeliveryError, Kick, KickReceiver, LocalBus, Mailbox, MailboxReceiver, Outbound,
    QueueLimits, QueueReceiver, Sender,
};
pub use hub::{
    EndedSession, FrameShare, GrantScope, Hub, HubLimits, LoggedInWith, OpenSession, RelayError,
    Route, SessionOpened, ViewerCap,
};
pub use sessions::{EndReason, SessionError, Sessions};
