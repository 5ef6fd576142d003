//! ARP's shapes as MCP's (pure functions): tools, resources, tool results.

use serde_json::{json, Value};
use signalling_protocol::arp::ArpCode;

use super::limits::{CONFIRMED_BY, CONSTRAINTS_URI, ESTOP_TOOL, RESOURCE_PREFIX};
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
            " The robot asks a human to confirm this tool: the call waits for a person's \
             answer (the operators' console, or this client where it can ask its user), and \
             is refused (-40006) where nobody can answer (arp-bridge on its own).",
        );
    }
    let mut meta = json!({ "arp/safety": safety });
    if let Some(d) = tool.get("estimatedDuration") {
        meta["arp/estimatedDuration"] = d.clone();
    }
    let hints = Hints::of(name, level, reversible);
    Some(json!({
        "name": name,
        "title": name,
        "description": text,
        "inputSchema": schema,
        "outputSchema": call_output_schema(),
        "annotations": {
            "title": name,
            "readOnlyHint": hints.read_only,
            "destructiveHint": hints.destructive,
            "idempotentHint": hints.idempotent,
            // It acts on (or reads) the physical world.
            "openWorldHint": true,
        },
        "_meta": meta,
    }))
}

/// What a tool's MCP annotations say. ARP has no read-only or idempotent marker, so they
/// come from the names ARP tools use (`list_*`, `get_*`, `capture_*` read at `normal`
/// level; `stop`, `cancel_*` end what
/// runs) and from the safety metadata: anything above `normal` level (motion) or not
/// reversible is destructive. A host may auto-approve a read; it must not auto-approve
/// motion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
}

impl Hints {
    pub fn of(name: &str, level: &str, reversible: bool) -> Hints {
        let reads = ["list_", "get_", "capture_"];
        let read_only =
            reads.iter().any(|prefix| name.starts_with(prefix)) && level == "normal" && reversible;
        let ends_motion = name == "stop" || name.starts_with("cancel_");
        Hints {
            read_only,
            destructive: !read_only && (level != "normal" || !reversible),
            idempotent: read_only || ends_motion,
        }
    }
}

/// The robot's velocity limit (`velocity_limit` constraint, enabled): its maximum linear
/// (m/s) and angular (rad/s) speeds, either absent when not said.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VelocityLimit {
    pub linear: Option<f64>,
    pub angular: Option<f64>,
}

impl VelocityLimit {
    /// From `arp.listConstraints`' result; `None` without an enabled velocity limit.
    pub fn from_constraints(listed: &Value) -> Option<VelocityLimit> {
        let constraint = listed
            .get("constraints")?
            .as_array()?
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("velocity_limit"))?;
        if constraint.get("enabled").and_then(Value::as_bool) == Some(false) {
            return None;
        }
        let parameters = constraint.get("parameters")?;
        let max = |key: &str| {
            parameters
                .get(key)
                .and_then(Value::as_f64)
                .filter(|v| v.is_finite() && *v >= 0.0)
        };
        Some(VelocityLimit {
            linear: max("max_linear"),
            angular: max("max_angular"),
        })
    }

    /// Puts the limits in an MCP tool's input schema: the numeric `linear` and `angular`
    /// arguments get `minimum`/`maximum` (a model learns them before it calls, not from a
    /// refusal).
    pub fn constrain(&self, tool: &mut Value) {
        let Some(properties) = tool
            .pointer_mut("/inputSchema/properties")
            .and_then(Value::as_object_mut)
        else {
            return;
        };
        for (key, max, unit) in [
            ("linear", self.linear, "m/s"),
            ("angular", self.angular, "rad/s"),
        ] {
            let (Some(max), Some(property)) = (max, properties.get_mut(key)) else {
                continue;
            };
            if property.get("type").and_then(Value::as_str) != Some("number") {
                continue;
            }
            property["minimum"] = json!(-max);
            property["maximum"] = json!(max);
            let said = property
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("");
            let said = format!("{said} (at most {max} {unit}: the robot's velocity_limit)");
            property["description"] = json!(said.trim_start());
        }
    }
}

/// The `structuredContent` of a successful ARP tool call: ARP's `arp.callTool` result.
pub fn call_output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "callId": { "type": "string", "description": "the robot's id of the call" },
            "state": { "type": "string", "enum": ["completed", "cancelled"] },
            "result": { "description": "what the tool returned, as the robot sent it" },
        },
    })
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
        "outputSchema": {
            "type": "object",
            "properties": { "stopped": { "type": "boolean" } },
        },
        "annotations": {
            "title": "Emergency stop",
            "readOnlyHint": false,
            // It halts motion: nothing it does needs undoing, and a host must never hold it
            // back for approval.
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

/// The robot's constraints as one MCP resource.
pub fn constraints_resource() -> Value {
    json!({
        "uri": CONSTRAINTS_URI,
        "name": "constraints",
        "title": "constraints",
        "description": "The robot's safety constraints (ARP arp.listConstraints): velocity \
                        limits, call rate, e-stop state, workspace",
        "mimeType": "application/json",
    })
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
        Ok(mut result) => {
            let image = take_image(&mut result);
            let state = result
                .get("state")
                .and_then(Value::as_str)
                .unwrap_or("completed");
            let text = format!("{name}: {state}. {result}");
            if let Some(image) = image {
                // The picture as MCP image content; the text and the structure keep only
                // what describes it (the bytes once is enough).
                return Ok(json!({
                    "content": [image, { "type": "text", "text": text }],
                    "structuredContent": result,
                    "isError": false,
                }));
            }
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

/// A tool's image (`result.image: {mimeType, data (base64), ...}`, as robot-agent's
/// `capture_image` returns it) taken out of an ARP call result, as MCP image content; the
/// result keeps the image's other members.
fn take_image(result: &mut Value) -> Option<Value> {
    let image = result.pointer_mut("/result/image")?.as_object_mut()?;
    let mime = image.get("mimeType")?.as_str()?.to_owned();
    if !mime.starts_with("image/") {
        return None;
    }
    let data = image.remove("data")?;
    data.is_string()
        .then(|| json!({ "type": "image", "data": data, "mimeType": mime }))
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
