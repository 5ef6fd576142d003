//! The server's API and WebSocket tests, one binary: one link step instead of one per file,
//! and one harness (`helpers`) shared by every module.

mod helpers;

mod abuse;
mod abuse2;
mod abuse3;
mod abuse3_http;
mod admin_api;
mod arp_gateway;
mod client_auth;
mod cluster;
mod fleet_ca;
mod harness;
mod legacy;
mod openapi;
mod resume;
mod robot_key;
mod robot_login;
mod robustness;
mod session_end;
mod sessions;
mod tickets;
mod trust;
mod x509;
