//! The ARP schema (written from arp-0.1.0.md) accepts the spec's own
//! examples and rejects what breaks its shapes.
#![cfg(feature = "schema")]

use serde_json::{json, Value};
use signalling_protocol::arp::{method, ArpCode};
use signalling_protocol::arp_schema::ArpValidator;

fn v() -> &'static ArpValidator {
    ArpValidator::shared()
}

#[test]
fn every_method_of_section_5_has_params_and_result_shapes() {
    for m in method::ALL {
        assert!(v().knows(m), "{m}");
    }
    assert!(!v().knows("arp.teleport"));
    assert_eq!(ArpCode::NotInitialized.code(), -40009);
}

#[test]
fn the_spec_examples_validate() {
    let examples: Vec<(Value, Option<&str>)> = vec![
        // §3.1.2 progress
        (
            json!({"jsonrpc": "2.0", "method": "arp.toolProgress", "params": {"callId": "call_123", "progress": 0.45, "message": "Moving to waypoint 3/7", "state": "running"}}),
            None,
        ),
        // §3.2.2 subscribe and update (frame world in the spec's example)
        (
            json!({"jsonrpc": "2.0", "id": 5, "method": "arp.subscribeContext", "params": {"name": "odometry", "maxRate": 10}}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "method": "arp.contextUpdate", "params": {"name": "odometry", "timestamp": "2026-02-27T12:00:00.000Z", "data": {"position": {"x": 1.2, "y": 0.5, "z": 0.0}, "orientation": {"x": 0, "y": 0, "z": 0.1, "w": 0.995}, "frame": "world"}}}),
            None,
        ),
        // §3.3.3 e-stop
        (
            json!({"jsonrpc": "2.0", "method": "arp.emergencyStop", "params": {"reason": "Unexpected obstacle detected"}}),
            None,
        ),
        // §4.1 plan request and answer
        (
            json!({"jsonrpc": "2.0", "id": 10, "method": "arp.requestPlan", "params": {"goal": "Pick up the red block", "currentState": {}, "availableTools": ["move_to"], "constraints": []}}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 10, "result": {"steps": [{"tool": "move_to", "params": {"target": [0.5, 0.3, 0.1]}, "description": "Move to red block"}], "reasoning": "Direct."}}),
            Some(method::REQUEST_PLAN),
        ),
        // §4.2 workspace
        (
            json!({"jsonrpc": "2.0", "id": 2, "method": "arp.setWorkspace", "params": {"name": "assembly_station", "bounds": {"type": "box", "min": [-1.0, -1.0, 0.0], "max": [1.0, 1.0, 2.0], "frame": "world"}, "objects": [{"name": "table", "pose": {"position": [0, 0, 0.75]}, "type": "static"}]}}),
            None,
        ),
        // §4.3 confirmation
        (
            json!({"jsonrpc": "2.0", "id": 20, "method": "arp.requestConfirmation", "params": {"action": "Activate cutting tool", "safetyLevel": "critical", "details": {"tool": "activate_cutter", "arguments": {"speed": 1000}}, "timeout": 30}}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 20, "result": {"confirmed": true, "confirmedBy": "operator_jane", "timestamp": "2026-02-27T12:05:00Z"}}),
            Some(method::REQUEST_CONFIRMATION),
        ),
        // §6.2 error
        (
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -40001, "message": "Safety violation", "data": {"constraint": "workspace_boundary", "requested": [3.0, 0.0, 0.0], "limit": [2.0, 2.0, 3.0]}}}),
            None,
        ),
        // §7 handshake
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "arp.initialize", "params": {"protocolVersion": "0.1.0", "clientInfo": {"name": "claude-robot-agent", "version": "1.0.0"}, "capabilities": {"planning": true, "confirmation": true}}}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "0.1.0", "serverInfo": {"name": "franka-arp-server", "version": "0.1.0", "robotModel": "Franka Emika Panda", "robotType": "manipulator"}, "capabilities": {"tools": true, "context": true, "constraints": true, "planning": true, "confirmation": true}}}),
            Some(method::INITIALIZE),
        ),
    ];
    for (example, answered) in examples {
        if let Err(e) = v().validate(&example, answered) {
            panic!("{e}\n{example}");
        }
    }
    // §3.3.2 constraint definition
    v().check(
        "Constraint",
        &json!({"name": "workspace_boundary", "type": "workspace_bound", "enabled": true, "priority": 100, "parameters": {"type": "box", "min": [-2.0, -2.0, 0.0], "max": [2.0, 2.0, 3.0], "frame": "world"}, "violation_action": "reject"}),
    )
    .expect("constraint");
    v().check(
        "SafetyMetadata",
        &json!({"level": "normal", "requiresConfirmation": false, "reversible": true, "description": "Moves the arm"}),
    )
    .expect("safety metadata");
}

#[test]
fn broken_messages_are_rejected() {
    let bad: Vec<(Value, Option<&str>)> = vec![
        (
            json!([{"jsonrpc": "2.0", "id": 1, "method": "arp.listTools"}]),
            None,
        ),
        (
            json!({"jsonrpc": "1.0", "id": 1, "method": "arp.listTools"}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "arp.fly"}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "method": "arp.callTool", "params": {"arguments": {}}}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "method": "arp.toolProgress", "params": {"callId": "c", "progress": 1.5, "message": "", "state": "running"}}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "method": "arp.contextUpdate", "params": {"name": "odometry", "timestamp": "noon", "data": {}}}),
            None,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "result": {"callId": "c", "state": "failed"}}),
            Some(method::CALL_TOOL),
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -40007, "message": "stopped", "data": {"reason": "x"}}}),
            Some(method::CALL_TOOL),
        ),
        (
            json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "0.2.0", "serverInfo": {"name": "x", "version": "1"}, "capabilities": {}}}),
            Some(method::INITIALIZE),
        ),
    ];
    for (message, answered) in bad {
        assert!(
            v().validate(&message, answered).is_err(),
            "accepted: {message}"
        );
    }
}
