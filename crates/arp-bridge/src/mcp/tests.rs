//! The ARP→MCP mapping and the robot side's routing, without a socket.

use serde_json::{json, Value};
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
    // Motion: destructive, never read-only, not idempotent.
    assert_eq!(t["annotations"]["destructiveHint"], true);
    assert_eq!(t["annotations"]["readOnlyHint"], false);
    assert_eq!(t["annotations"]["idempotentHint"], false);
    assert_eq!(t["annotations"]["openWorldHint"], true);
    assert_eq!(t["outputSchema"]["type"], "object");
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
fn hints_tell_reads_from_motion() {
    let safe = |name: &str, level: &str| json!({ "name": name, "safety": { "level": level, "reversible": true } });
    let hints = |tool: Value| mcp_tool(&tool).unwrap()["annotations"].clone();
    let read = hints(safe("list_locations", "normal"));
    assert_eq!(read["readOnlyHint"], true);
    assert_eq!(read["destructiveHint"], false);
    assert_eq!(read["idempotentHint"], true);
    // A `get_` that moves is no read.
    assert_eq!(hints(safe("get_closer", "elevated"))["readOnlyHint"], false);
    let stop = hints(safe("stop", "normal"));
    assert_eq!(stop["readOnlyHint"], false);
    assert_eq!(stop["destructiveHint"], false);
    assert_eq!(stop["idempotentHint"], true);
    assert_eq!(
        hints(safe("cancel_navigation", "normal"))["idempotentHint"],
        true
    );
    let save = hints(safe("save_location", "normal"));
    assert_eq!(save["readOnlyHint"], false);
    assert_eq!(save["idempotentHint"], false);
    assert_eq!(
        hints(safe("navigate_to", "elevated"))["destructiveHint"],
        true
    );
    assert_eq!(estop_tool()["annotations"]["idempotentHint"], true);
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
    let mut stop = robot
        .start_call("stop", json!({}), None, true)
        .await
        .unwrap();
    let mut drive = robot
        .start_call("drive", json!({}), Some("key-1"), true)
        .await
        .unwrap();
    assert!(rx.recv().await.unwrap().contains("arp.callTool"));
    let keyed = rx.recv().await.unwrap();
    assert!(keyed.contains("\"idempotencyKey\":\"key-1\""), "{keyed}");
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

#[test]
fn velocity_limits_bound_the_drive_schema() {
    let listed = json!({ "constraints": [
        { "name": "rate_limit", "type": "rate_limit", "enabled": true, "parameters": {} },
        { "name": "velocity_limit", "type": "velocity_limit", "enabled": true,
          "parameters": { "max_linear": 0.5, "max_angular": 1.0 } },
    ] });
    let limit = VelocityLimit::from_constraints(&listed).unwrap();
    assert_eq!(limit.linear, Some(0.5));
    let mut tool = mcp_tool(
        &json!({ "name": "drive", "parameters": { "type": "object", "properties": {
        "linear": { "type": "number", "description": "forward speed" },
        "angular": { "type": "number" },
        "durationSecs": { "type": "number" },
    } } }),
    )
    .unwrap();
    limit.constrain(&mut tool);
    let p = &tool["inputSchema"]["properties"];
    assert_eq!(p["linear"]["maximum"], 0.5);
    assert_eq!(p["linear"]["minimum"], -0.5);
    assert_eq!(p["angular"]["maximum"], 1.0);
    assert!(p["durationSecs"].get("maximum").is_none());
    assert!(p["linear"]["description"]
        .as_str()
        .unwrap()
        .contains("0.5 m/s"));
    let disabled = json!({ "constraints": [{ "type": "velocity_limit", "enabled": false, "parameters": { "max_linear": 1 } }] });
    assert!(VelocityLimit::from_constraints(&disabled).is_none());
}

#[test]
fn an_image_result_is_image_content() {
    let arp = json!({ "callId": "c2", "state": "completed", "result": { "image": {
        "mimeType": "image/jpeg", "width": 320, "height": 240, "data": "/9j/AA==" } } });
    let r = call_result("capture_image", Ok(arp)).unwrap();
    assert_eq!(r["content"][0]["type"], "image");
    assert_eq!(r["content"][0]["mimeType"], "image/jpeg");
    assert_eq!(r["content"][0]["data"], "/9j/AA==");
    assert_eq!(r["content"][1]["type"], "text");
    assert!(!r["content"][1]["text"].as_str().unwrap().contains("/9j/"));
    assert_eq!(r["structuredContent"]["result"]["image"]["width"], 320);
    assert!(r["structuredContent"]["result"]["image"]
        .get("data")
        .is_none());
}
