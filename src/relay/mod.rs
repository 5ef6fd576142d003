//! The relay: who is online, which sessions exist, and delivery of messages between the two
//! ends of a session.
//!
//! `Hub` owns presence and sessions (plain data behind a `std::sync::Mutex`, never held
//! across an await); `Bus` is the delivery interface. The in-process `LocalBus` hands
//! messages to socket queues on this node; a multi-node bus (e.g. Redis pub/sub) implements
//! the same trait without touching the WebSocket protocol code.

mod bus;
mod hub;

pub use bus::{Bus, ConnId, DeliveryError, Kick, LocalBus, Mailbox, MailboxReceiver, Outbound};
pub use hub::{EndedSession, Hub, OpenSession, RelayError, Route, SessionOpened};
