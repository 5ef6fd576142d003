//! `--mode mcp`: the robot as a Model Context Protocol server (MCP
//! 2025-06-18, also answering 2025-03-26 and 2024-11-05 clients). The
//! bridge is the ARP client: it initializes the ARP connection itself,
//! maps ARP tools to MCP tools, context sources to MCP resources, and adds
//! an `emergency_stop` tool. [`robot`] is the ARP side (requests, routing of answers and
//! notifications), [`server`] the MCP side (the parent's requests),
//! [`tools`] serves the requests that wait on the robot, [`shapes`] maps
//! ARP's shapes to MCP's.
//!
//! Confirmation fails closed: the bridge declares `confirmation: false`,
//! and an `arp.requestConfirmation` that arrives anyway is answered
//! `confirmed: false` (no human is reachable through this pipe), so the
//! tool call fails with -40006 and the model is told why.

mod limits;
mod robot;
mod server;
mod shapes;
mod tools;

pub use limits::{
    CONFIRMED_BY, ESTOP_TOOL, MAX_IN_FLIGHT, PROTOCOL_VERSIONS, RESOURCE_NOT_FOUND, RESOURCE_PREFIX,
};
pub use robot::{Robot, RobotError};
pub use server::{describe, run};
pub use shapes::{call_result, error_result, estop_tool, mcp_resource, mcp_tool};

#[cfg(test)]
mod tests;
