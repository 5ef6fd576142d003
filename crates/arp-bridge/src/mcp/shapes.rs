//! ARP's shapes as MCP's (pure functions): tools, resources, tool results.

use serde_json::{json, Value};
use signalling_protocol::arp::ArpCode;

use super::limits::{CONFIRMED_BY, ESTOP_TOOL, RESOURCE_PREFIX};
use crate::jsonrpc::{RpcError, INTERNAL_ERROR, INVALID_PARAMS};

/// An ARP Tool as an MCP tool; `None` for one without a name.
pub fn mcp_tool(tool: &Value) -> Option<Value> {
    let name = tool.get("name")?.as_str()?;
    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut schema = match tool.get("parameters") {
        Some(Value::Object(s)) => Value::Object(s.clone()),
        _ => json!({ "type": "object", "properties": {} }),
    };
    if schema.get("type").is_none() {
        schema["type"] = json!("object");
    }
    let safety = tool.get("safety").cloned().unwrap_or_else(|| json!({}));
    let level = safety
        .get("level")
        .and_then(Value::as_str)
        .unwrap_or("normal");
    let reversible = safety
        .get("reversible")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let confirm = safety
        .get("requiresConfirmation")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut text = format!("{description}\n\nSafety: {level}");
    if let Some(note) = safety.get("description").and_then(Value::as_str) {
        text.push_str(&format!(" ({note})"));
    }
    text.push_str(if reversible {
        "; reversible."
    } else {
        "; not reversible."
    });
    if confirm {
        text.push_str(
            " The robot asks a human to confirm this tool; through this MCP bridge no human \
             can answer, so the call is refused (-40006) unless the robot's configuration \
             changes.",
        );
    }
    let mut meta = json!({ "arp/safety": safety });
    if let Some(d) = tool.get("estimatedDuration") {
        meta["arp/estimatedDuration"] = d.clone();
    }
    Some(json!({
        "name": name,
        "title": name,
        "description": text,
        "inputSchema": schema,
        "annotations": {
            "title": name,
            // ARP has no read-only marker: every tool may act on the robot.
            "readOnlyHint": false,
            "destructiveHint": !reversible || level == "critical",
            "idempotentHint": false,
            // It acts on the physical world.
            "openWorldHint": true,
        },
        "_meta": meta,
    }))
}

/// The bridge's own tool: `arp.emergencyStop`.
pub fn estop_tool() -> Value {
    json!({
        "name": ESTOP_TOOL,
        "title": "Emergency stop",
        "description": "Emergency stop: halt all motion now and latch the robot's e-stop \
                        (ARP arp.emergencyStop). Anyone may call it, any time; running tool \
                        calls fail with -40007 and motion stays refused until an operator \
                        calls reset_emergency_stop.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "reason": { "type": "string", "maxLength": 256, "description": "why, for the robot's log" },
            },
            "additionalProperties": false,
        },
        "annotations": {
            "title": "Emergency stop",
            "readOnlyHint": false,
            "destructiveHint": false,
            "idempotentHint": true,
            "openWorldHint": true,
        },
    })
}

/// An ARP ContextSource as an MCP resource.
pub fn mcp_resource(source: &Value) -> Option<Value> {
    let name = source.get("name")?.as_str()?;
    let mut description = source
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let mut facts = Vec::new();
    if let Some(t) = source.get("dataType").and_then(Value::as_str) {
        facts.push(format!("dataType {t}"));
    }
    if let Some(f) = source.get("coordinateFrame").and_then(Value::as_str) {
        facts.push(format!("frame {f}"));
    }
    if let Some(r) = source.get("updateRate").and_then(Value::as_f64) {
        facts.push(format!("{r} updates/s"));
    }
    if !facts.is_empty() {
        description.push_str(&format!(" (ARP context: {})", facts.join(", ")));
    }
    Some(json!({
        "uri": format!("{RESOURCE_PREFIX}{name}"),
        "name": name,
        "title": name,
        "description": description,
        "mimeType": "application/json",
    }))
}

pub(super) fn text_result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
        "isError": is_error,
    })
}

/// The answer to `tools/call` from the ARP outcome: a tool result (with
/// `isError` for ARP errors of the call), or a JSON-RPC error for what is
/// a protocol matter (unknown tool, a request the robot could not read).
pub fn call_result(name: &str, outcome: Result<Value, RpcError>) -> Result<Value, RpcError> {
    match outcome {
        Ok(result) => {
            let state = result
                .get("state")
                .and_then(Value::as_str)
                .unwrap_or("completed");
            let text = format!("{name}: {state}. {result}");
            let structured = if result.is_object() {
                result
            } else {
                json!({ "result": result })
            };
            Ok(text_result(text, structured, false))
        }
        Err(e) => match e.code {
            c if c == ArpCode::ToolNotFound.code() => Err(RpcError::new(
                INVALID_PARAMS,
                format!("Unknown tool: {name}"),
            )),
            -32700 | -32600 | -32601 => Err(RpcError::new(
                INTERNAL_ERROR,
                format!(
                    "the robot could not read the bridge's request: {}",
                    e.message
                ),
            )),
            c if c == ArpCode::NotInitialized.code() => {
                Err(RpcError::new(INTERNAL_ERROR, e.message.clone()))
            }
            _ => Ok(error_result(&e)),
        },
    }
}

/// An ARP error as a tool result with `isError: true`: the code, its name
/// and the reason in the text, everything in `structuredContent.error`.
pub fn error_result(e: &RpcError) -> Value {
    let name = ArpCode::from_code(e.code).map_or("Error", |c| c.name());
    let mut text = format!("ARP error {} ({name}): {}", e.code, e.message);
    let data = e.data.clone().unwrap_or_else(|| json!({}));
    if let Some(why) = data.get("reason").and_then(Value::as_str) {
        text.push_str(&format!(" [reason: {why}]"));
    }
    if let Some(c) = data.get("constraint").and_then(Value::as_str) {
        text.push_str(&format!(" [constraint: {c}]"));
    }
    if e.code == ArpCode::ConfirmationDenied.code()
        && data.get("confirmedBy").and_then(Value::as_str) == Some(CONFIRMED_BY)
    {
        text.push_str(
            " The robot wanted a human's confirmation; arp-bridge refuses such requests \
             because no human can answer through MCP.",
        );
    }
    let mut error = json!({ "code": e.code, "name": name, "message": e.message });
    if e.data.is_some() {
        error["data"] = data;
    }
    text_result(text, json!({ "error": error }), true)
}
