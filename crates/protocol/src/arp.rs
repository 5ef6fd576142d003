//! The Autonomous Robot Protocol (ARP 0.1.0) as this project speaks it:
//! method names, error codes and limits shared by the robot agent, the
//! server's gateway and the tests. The message shapes are the JSON Schema
//! `schemas/arp/arp-0.1.0.schema.json` (checked with the `schema` feature,
//! [`crate::arp_schema`]); `arp-contract.md` fixes what the spec leaves open.

/// The protocol version this implementation speaks.
pub const ARP_VERSION: &str = "0.1.0";

/// Largest accepted frame (one JSON-RPC message).
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// The JSON Schema of ARP messages, as text.
pub const SCHEMA: &str = include_str!("../schemas/arp/arp-0.1.0.schema.json");

/// Label of the WebRTC data channel that carries ARP.
pub const DATA_CHANNEL_LABEL: &str = "arp";

/// Method names (spec section 5).
pub mod method {
    pub const INITIALIZE: &str = "arp.initialize";
    pub const SHUTDOWN: &str = "arp.shutdown";
    pub const EMERGENCY_STOP: &str = "arp.emergencyStop";
    pub const LIST_TOOLS: &str = "arp.listTools";
    pub const CALL_TOOL: &str = "arp.callTool";
    pub const CANCEL_TOOL: &str = "arp.cancelTool";
    pub const TOOL_PROGRESS: &str = "arp.toolProgress";
    pub const LIST_CONTEXT: &str = "arp.listContext";
    pub const SUBSCRIBE_CONTEXT: &str = "arp.subscribeContext";
    pub const UNSUBSCRIBE_CONTEXT: &str = "arp.unsubscribeContext";
    pub const CONTEXT_UPDATE: &str = "arp.contextUpdate";
    pub const LIST_CONSTRAINTS: &str = "arp.listConstraints";
    pub const GET_CONSTRAINT: &str = "arp.getConstraint";
    pub const REQUEST_PLAN: &str = "arp.requestPlan";
    pub const SET_WORKSPACE: &str = "arp.setWorkspace";
    pub const REQUEST_CONFIRMATION: &str = "arp.requestConfirmation";

    /// Every method of section 5, in the spec's order.
    pub const ALL: &[&str] = &[
        INITIALIZE,
        SHUTDOWN,
        EMERGENCY_STOP,
        LIST_TOOLS,
        CALL_TOOL,
        CANCEL_TOOL,
        TOOL_PROGRESS,
        LIST_CONTEXT,
        SUBSCRIBE_CONTEXT,
        UNSUBSCRIBE_CONTEXT,
        CONTEXT_UPDATE,
        LIST_CONSTRAINTS,
        GET_CONSTRAINT,
        REQUEST_PLAN,
        SET_WORKSPACE,
        REQUEST_CONFIRMATION,
    ];
}

/// Error codes of spec section 6.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpCode {
    ParseError,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    InternalError,
    SafetyViolation,
    PreconditionFailed,
    ToolNotFound,
    ToolBusy,
    ConfirmationTimeout,
    ConfirmationDenied,
    EmergencyStopped,
    ContextNotFound,
    NotInitialized,
}

impl ArpCode {
    pub const ALL: [ArpCode; 14] = [
        ArpCode::ParseError,
        ArpCode::InvalidRequest,
        ArpCode::MethodNotFound,
        ArpCode::InvalidParams,
        ArpCode::InternalError,
        ArpCode::SafetyViolation,
        ArpCode::PreconditionFailed,
        ArpCode::ToolNotFound,
        ArpCode::ToolBusy,
        ArpCode::ConfirmationTimeout,
        ArpCode::ConfirmationDenied,
        ArpCode::EmergencyStopped,
        ArpCode::ContextNotFound,
        ArpCode::NotInitialized,
    ];

    /// The number on the wire.
    pub fn code(self) -> i64 {
        match self {
            ArpCode::ParseError => -32700,
            ArpCode::InvalidRequest => -32600,
            ArpCode::MethodNotFound => -32601,
            ArpCode::InvalidParams => -32602,
            ArpCode::InternalError => -32603,
            ArpCode::SafetyViolation => -40001,
            ArpCode::PreconditionFailed => -40002,
            ArpCode::ToolNotFound => -40003,
            ArpCode::ToolBusy => -40004,
            ArpCode::ConfirmationTimeout => -40005,
            ArpCode::ConfirmationDenied => -40006,
            ArpCode::EmergencyStopped => -40007,
            ArpCode::ContextNotFound => -40008,
            ArpCode::NotInitialized => -40009,
        }
    }

    /// The spec's name of the code.
    pub fn name(self) -> &'static str {
        match self {
            ArpCode::ParseError => "Parse Error",
            ArpCode::InvalidRequest => "Invalid Request",
            ArpCode::MethodNotFound => "Method Not Found",
            ArpCode::InvalidParams => "Invalid Params",
            ArpCode::InternalError => "Internal Error",
            ArpCode::SafetyViolation => "Safety Violation",
            ArpCode::PreconditionFailed => "Precondition Failed",
            ArpCode::ToolNotFound => "Tool Not Found",
            ArpCode::ToolBusy => "Tool Busy",
            ArpCode::ConfirmationTimeout => "Confirmation Timeout",
            ArpCode::ConfirmationDenied => "Confirmation Denied",
            ArpCode::EmergencyStopped => "Emergency Stopped",
            ArpCode::ContextNotFound => "Context Not Found",
            ArpCode::NotInitialized => "Not Initialized",
        }
    }

    pub fn from_code(code: i64) -> Option<ArpCode> {
        ArpCode::ALL.into_iter().find(|c| c.code() == code)
    }
}

/// `data.reason` values this project adds to the spec's codes
/// (arp-contract.md).
pub mod reason {
    pub const FORBIDDEN: &str = "forbidden";
    pub const ROBOT_BUSY: &str = "robot_busy";
    pub const ROBOT_OFFLINE: &str = "robot_offline";
    pub const BAD_TICKET: &str = "bad_ticket";
    pub const RATE_LIMITED: &str = "rate_limited";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for c in ArpCode::ALL {
            assert!(seen.insert(c.code()));
            assert_eq!(ArpCode::from_code(c.code()), Some(c));
        }
        assert_eq!(ArpCode::from_code(1), None);
        assert_eq!(method::ALL.len(), 16);
    }
}
