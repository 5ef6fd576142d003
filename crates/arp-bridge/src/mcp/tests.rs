//! The ARP→MCP mapping and the robot side's routing, without a socket.

use serde_json::json;
use tokio::sync::mpsc;

use super::robot::{Robot, RobotError};
use super::shapes::*;
use super::*;
use crate::jsonrpc::{RpcError, INVALID_PARAMS};

#[test]
fn tools_keep_their_schema_and_say_their_safety() {
    let arp = json!({
        "name": "drive",
        "description": "Drive.",
        "parameters": { "type": "object", "properties": { "linear": { "type": "number" } } },
        "safety": { "level": "elevated", "requiresConfirmation": true, "reversible": true, "description": "Moves" },
    });
    let t = mcp_tool(&arp).unwrap();
    assert_eq!(t["name"], "drive");
    assert_eq!(t["inputSchema"], arp["parameters"]);
    assert_eq!(t["annotations"]["destructiveHint"], false);
    assert_eq!(t["annotations"]["openWorldHint"], true);
    assert_eq!(t["_meta"]["arp/safety"]["level"], "elevated");
    let text = t["description"].as_str().unwrap();
    assert!(
        text.contains("elevated") && text.contains("-40006"),
        "{text}"
    );
    let reset = json!({ "name": "r", "description": "", "parameters": {}, "safety": { "level": "elevated", "reversible": false } });
    let t = mcp_tool(&reset).unwrap();
    assert_eq!(t["annotations"]["destructiveHint"], true);
    assert_eq!(t["inputSchema"]["type"], "object");
    assert!(mcp_tool(&json!({ "description": "no name" })).is_none());
}

#[test]
fn arp_errors_are_tool_errors_and_protocol_errors_are_not() {
    let forbidden = RpcError::new(-40001, "a viewer may not do this")
        .with_data(json!({ "reason": "forbidden", "role": "viewer" }));
    let r = call_result("drive", Err(forbidden)).unwrap();
    assert_eq!(r["isError"], true);
    assert_eq!(r["structuredContent"]["error"]["code"], -40001);
    assert_eq!(
        r["structuredContent"]["error"]["data"]["reason"],
        "forbidden"
    );
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("-40001") && text.contains("forbidden"),
        "{text}"
    );
    let unknown = call_result("nope", Err(RpcError::new(-40003, "tool not found")));
    assert_eq!(unknown.unwrap_err().code, INVALID_PARAMS);
    let ok = call_result("stop", Ok(json!({ "callId": "c1", "state": "completed" }))).unwrap();
    assert_eq!(ok["isError"], false);
    assert_eq!(ok["structuredContent"]["callId"], "c1");
    let denied = RpcError::new(-40006, "confirmation denied")
        .with_data(json!({ "confirmedBy": CONFIRMED_BY }));
    let text = error_result(&denied)["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("no human"), "{text}");
}

#[test]
fn context_sources_are_resources() {
    let r = mcp_resource(&json!({
        "name": "odometry", "description": "Pose", "dataType": "pose",
        "coordinateFrame": "odom", "updateRate": 20.0,
    }))
    .unwrap();
    assert_eq!(r["uri"], "arp://context/odometry");
    assert_eq!(r["mimeType"], "application/json");
    assert!(r["description"].as_str().unwrap().contains("frame odom"));
}

#[tokio::test]
async fn progress_finds_its_call_and_confirmation_is_refused() {
    let (tx, mut rx) = mpsc::channel(8);
    let robot = Robot::new(tx);
    robot.remember_tools(&[
        json!({ "name": "stop", "estimatedDuration": 0.0 }),
        json!({ "name": "drive" }),
    ]);
    let mut stop = robot.start_call("stop", json!({}), true).await.unwrap();
    let mut drive = robot.start_call("drive", json!({}), true).await.unwrap();
    assert!(rx.recv().await.unwrap().contains("arp.callTool"));
    let progress = json!({ "jsonrpc": "2.0", "method": "arp.toolProgress",
        "params": { "callId": "call-9", "progress": 0.0, "message": "accepted", "state": "running" } });
    assert!(robot.dispatch(&progress.to_string()).is_none());
    // The instant `stop` is passed over: `drive` reports progress.
    assert_eq!(drive.known.borrow().as_deref(), Some("call-9"));
    assert!(stop.known.borrow().is_none());
    let got = drive.progress.as_mut().unwrap().try_recv().unwrap();
    assert_eq!(got, (0.0, Some("accepted".into())));
    assert!(stop.progress.as_mut().unwrap().try_recv().is_err());

    let ask = json!({ "jsonrpc": "2.0", "id": "confirm-1", "method": "arp.requestConfirmation",
        "params": { "action": "x", "safetyLevel": "critical", "details": { "tool": "x", "arguments": {} }, "timeout": 30 } });
    let answer = robot.dispatch(&ask.to_string()).unwrap();
    assert_eq!(answer["id"], "confirm-1");
    assert_eq!(answer["result"]["confirmed"], false);

    robot.close();
    assert_eq!((&mut stop.reply).await.unwrap(), Err(RobotError::Closed));
    assert!(robot.request("arp.listTools", json!({})).await.is_err());
    assert!(robot.dispatch("not json").is_none());
}
