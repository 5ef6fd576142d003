//! `--mode mcp`: the robot as a Model Context Protocol server (MCP
//! 2025-06-18, also answering 2025-03-26 and 2024-11-05 clients). The
//! bridge is the ARP client: it initializes the ARP connection itself,
//! maps ARP tools to MCP tools, context sources to MCP resources, and adds
//! an `emergency_stop` tool. [`session`] is one MCP session whatever carries it (this
//! bridge, or the server's remote endpoint at `/v1/robots/{id}/mcp`, which runs the same
//! code over an in-process gateway session); [`robot`] is the ARP side (requests, routing of answers and
//! notifications), [`server`] the MCP side (the parent's requests),
//! [`tools`] serves the requests that wait on the robot, [`shapes`] maps
//! ARP's shapes to MCP's.
//!
//! Confirmation: a robot's `arp.requestConfirmation` is put to the client's
//! user through MCP elicitation when the client declared it; otherwise it is
//! answered `confirmed: false` at once (a model must not approve for a
//! human), so the tool call fails with -40006 and the model is told why. The
//! bridge declares `confirmation: false` to ARP (a gateway then asks people
//! in its console); the server's endpoint declares it when its client can
//! elicit, and the gateway passes the request on where the robot's policy
//! lets the client answer.

mod ends;
mod limits;
mod prompts;
mod reconnect;
mod robot;
mod server;
mod session;
mod shapes;
mod tools;

pub use limits::{
    CONFIRMED_BY, CONSTRAINTS_URI, ESTOP_TOOL, MAX_IN_FLIGHT, PROTOCOL_VERSIONS,
    RESOURCE_NOT_FOUND, RESOURCE_PREFIX,
};
pub use reconnect::TOKEN_ENDED;
pub use robot::{Robot, RobotError};
pub use server::{describe, refuse_start, run};
pub use session::{
    arp_initialize_params, client_elicits, initialize_result, initialize_robot, Host, Session,
    CONFIRMED_BY_CLIENT,
};
pub use shapes::{
    call_output_schema, call_result, error_result, estop_tool, mcp_resource, mcp_tool, Hints,
    VelocityLimit,
};

#[cfg(test)]
mod tests;
