//! Support for the tests and benches that need the real signalling server and the real
//! robot-agent together (robot-agent's own tests run against a scripted server,
//! `robot_agent::testutil`):
//! * [`server`]: the server on 127.0.0.1:0 and a robot-agent enrolled with it;
//! * [`arp_runner`]: the ARP 0.1.0 conformance runner, against any ARP endpoint.

pub mod arp_runner;
pub mod server;
