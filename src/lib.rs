//! signalling-server: robots register and prove who they are, browser clients are checked
//! against per-robot grants, and WebRTC offers, answers and ICE candidates are relayed
//! between the two ends of each session.
//!
//! Layout, one job per module:
//! - [`config`]: flags and environment.
//! - [`server`]: startup, listening (plain or TLS) and graceful shutdown; `lean_io`: the
//!   accepted sockets, which hold no read buffer while idle; `http_serve`: HTTP/1.1 on
//!   each, within deadlines; [`admission`]: how many connections, in all and per source.
//! - [`app`]: the router, wired in one place from every module's routes.
//! - [`tasks`]: background work (CRL watcher, JWKS refresh), stopped on shutdown through a
//!   [`shutdown::StopSignal`].
//! - [`api`]: the HTTP API (admin, enrollment, health, metrics).
//! - [`ws`]: the `/ws` endpoint: socket loop and the signalling protocol.
//! - [`arp`]: the ARP gateway, `/v1/robots/{id}/arp`: programs drive robots under the same
//!   rules as people, every call on record.
//! - [`relay`]: presence, sessions and message delivery between sockets.
//! - [`delivery`]: each socket's bounded queue on this node, and kicks.
//! - [`cluster`]: several nodes on one Redis (presence, the bus between nodes, control locks).
//! - [`identity`]: robot login (PKI challenges) and enrollment rules.
//! - [`pki`]: keys, signatures, X.509 chains, our CA and CRLs, the deployment's signing key.
//! - [`tickets`]: the signed session tickets in what is forwarded to robots.
//! - [`auth`]: admin and client tokens, JWTs.
//! - [`store`]: the database.
//! - [`messages`]: messages the server originates; [`logging`]: text logs a peer cannot forge.
//! - [`dev_pki`]: the `pki` subcommand (development CA and robot certificates).
//! - [`ice`], [`metrics`].

pub mod admission;
pub mod api;
pub mod app;
pub mod arp;
pub mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod console;
pub mod delivery;
pub mod dev_pki;
mod http_error;
mod http_serve;
pub mod ice;
pub mod identity;
mod lean_io;
pub mod logging;
pub mod mcp;
pub mod messages;
pub mod metrics;
pub mod origin;
pub mod pki;
pub mod rate_limit;
pub mod relay;
pub mod server;
pub mod shutdown;
pub mod state;
pub mod store;
pub mod tasks;
pub mod tickets;
pub mod ws;

pub use config::Config;
pub use server::{Server, StartError};
