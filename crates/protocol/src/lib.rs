//! Typed messages of the Modulr agent interface spec (`signalling.*` and
//! `agent.*`), as spoken between robots, web clients and the signalling
//! server.
//!
//! The JSON Schemas bundled under `spec/` are the source of truth; this crate
//! mirrors them so that the server and the robot agent share one definition
//! of the wire format instead of hand-building JSON.
//!
//! * [`Envelope`] is the common header; [`Envelope::parse`] checks it.
//! * [`Envelope::body`] turns the payload into a typed [`Body`];
//!   [`Envelope::from_body`] goes the other way.
//! * [`SessionMeta`] and [`Role`]: the `meta.session` the server stamps on
//!   what it forwards to a robot.
//! * [`ticket`]: the claims of the signed session tickets in
//!   `meta.session.ticket` and how a call's params are hashed for them.
//! * With the `schema` feature, `schema::SchemaValidator` checks whole
//!   messages against the spec's JSON Schemas (used by tests).
//! * [`arp`]: the Autonomous Robot Protocol's names, codes and schema;
//!   `arp_schema::ArpValidator` (feature `schema`) checks ARP messages;
//!   [`ArpFramePayload`] is the `arp.frame` envelope that carries ARP on a
//!   robot's signalling socket (the server's gateway).

mod agent;
pub mod arp;
mod body;
mod common;
mod envelope;
mod error;
mod legacy;
mod relayed;
mod session;
mod signalling;
pub mod ticket;

#[cfg(feature = "schema")]
pub mod arp_schema;
#[cfg(feature = "schema")]
pub mod schema;

pub use agent::{
    Agent, ConfigGetResponsePayload, ConfigResponsePayload, ConfigUpdatePayload, Location,
    LocationDeletePayload, LocationOperation, LocationResponsePayload, MovementPayload,
    NavigationResponsePayload, NavigationStartPayload, NavigationStatus, Orientation, Position,
};
pub use arp::ArpFramePayload;
pub use body::{requires_correlation_id, Body, MESSAGE_TYPES};
pub use common::{CapabilitiesPayload, ErrorPayload};
pub use envelope::{is_legacy_ready, Envelope};
pub use error::{ErrorCode, ProtocolError};
pub use legacy::{parse_legacy_movement, LEGACY_MOVEMENT_TYPE};
pub use relayed::{ArpFrameView, Relayed, RelayedKind};
pub use session::{Role, SessionMeta, SESSION_META_KEY};
pub use signalling::{
    AnswerPayload, AnswerSdpType, ConnectedIceState, ConnectedPayload, DataChannelState,
    DisconnectReason, DisconnectedPayload, IceCandidatePayload, IceServer, OfferPayload,
    OfferSdpType, PkiChallengePayload, PkiResponsePayload, PkiVerifiedPayload,
    RegisterCapabilities, RegisterPayload, Signalling, WelcomePayload,
};

/// Version this implementation writes into the messages it creates.
pub const PROTOCOL_VERSION: &str = "0.5";

/// Every spec release this implementation understands; all share major 0, so
/// any of them (and, per semver, later 0.x minors) is accepted on input.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.0", "0.1", "0.2", "0.3", "0.4", "0.5"];
