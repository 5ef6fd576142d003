//! The MCP mode's fixed names (versions, the e-stop tool, resource URIs)
//! and bounds (waits, requests in flight, queues).

use std::time::Duration;

/// MCP versions answered, newest first (the first is offered to clients
/// asking for one we do not know).
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];
/// The MCP tool that maps to `arp.emergencyStop`.
pub const ESTOP_TOOL: &str = "emergency_stop";
/// MCP resource URIs of ARP context sources: this prefix and the name.
pub const RESOURCE_PREFIX: &str = "arp://context/";
/// The MCP resource of the robot's constraints (`arp.listConstraints`).
pub const CONSTRAINTS_URI: &str = "arp://constraints";
/// `confirmedBy` of the bridge's refusals.
pub const CONFIRMED_BY: &str = "arp-bridge (no human reachable; refused)";
/// MCP's "resource not found".
pub const RESOURCE_NOT_FOUND: i64 = -32002;

/// Longest wait for the robot's answer to a quick request (listings,
/// initialize, e-stop). Tool calls have no bound here: the robot bounds
/// them (30 s drives, 300 s driver tools, its confirmation timeout).
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a context update when reading a resource.
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a bridge that could not start waits for the host's first request, to tell it
/// why in the answer.
pub(super) const START_ERROR_WAIT: Duration = Duration::from_secs(10);
/// How long a cancelled call may take to end before it is forgotten.
pub(super) const CANCEL_WAIT: Duration = Duration::from_secs(30);
/// MCP requests served at once; more are refused, not queued.
pub const MAX_IN_FLIGHT: usize = 32;
/// Requests to the robot awaiting an answer, at most.
pub(super) const MAX_PENDING: usize = 256;
/// Updates a second of a subscribed resource, at most (ARP's `maxRate`).
pub const SUBSCRIBE_RATE: f64 = 5.0;
/// Resource updates queued for the client (more are dropped until it catches up).
pub(super) const UPDATES_QUEUE: usize = 16;
/// Progress updates queued per call (older ones are dropped when full).
pub(super) const PROGRESS_QUEUE: usize = 16;
