//! The robot side of the signalling system: proves the robot's identity to
//! the signalling server, answers browsers' WebRTC offers, and bridges the
//! `agent.*` data-channel protocol to a driver through a safety layer.
//!
//! Layers, outermost first:
//! * [`signalling`]: WebSocket client (register, PKI proof, reconnect);
//! * [`tickets`]: the server's signed session tickets, checked against the keys
//!   pinned at enrollment ([`server_keys`]) before anything acts on a message;
//! * [`peer`]: one WebRTC peer connection per session;
//! * [`session`]: the `agent.*` protocol of one session, its replies signed
//!   with the robot's key when `sign_replies` is on ([`reply_signing`]);
//! * [`controller`] + [`safety`]: every motion decision, in one task;
//! * [`driver`]: sim, exec, rosbridge and serial back ends;
//! * [`video`]: camera sources, one track each shared by every session;
//! * [`arp`]: the ARP 0.1.0 server (data channel `arp`, `--arp-listen`, the
//!   server's gateway through the signalling socket).

pub mod agent;
pub mod arp;
pub mod budget;
pub mod config;
pub mod controller;
pub mod driver;
pub mod enroll;
pub mod fsutil;
pub mod identity;
pub mod locations;
pub mod messages;
pub mod peer;
pub mod reply_signing;
pub mod safety;
pub mod server_keys;
pub mod session;
pub mod settings;
pub mod signalling;
pub mod tickets;
pub mod video;

#[cfg(any(test, feature = "test-support"))]
pub mod testutil;
