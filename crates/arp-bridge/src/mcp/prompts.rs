//! MCP prompts that help a model use a robot safely: fixed texts, with the tools and
//! resources every session has.

use serde_json::{json, Map, Value};

use super::limits::{CONSTRAINTS_URI, ESTOP_TOOL, RESOURCE_PREFIX};
use crate::jsonrpc::{RpcError, INVALID_PARAMS};

struct Prompt {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    /// (name, description) of its required arguments.
    arguments: &'static [(&'static str, &'static str)],
}

const PROMPTS: &[Prompt] = &[
    Prompt {
        name: "inspect_surroundings",
        title: "Inspect the surroundings",
        description: "Look at where the robot is and what it sees, without moving it",
        arguments: &[],
    },
    Prompt {
        name: "go_to_location_and_report",
        title: "Go to a saved location and report",
        description: "Drive to a saved location, then say what the robot sees there",
        arguments: &[("location", "the name of a saved location (list_locations)")],
    },
];

/// `prompts/list`.
pub fn list() -> Value {
    let prompts: Vec<Value> = PROMPTS
        .iter()
        .map(|p| {
            let arguments: Vec<Value> = p
                .arguments
                .iter()
                .map(|(name, description)| {
                    json!({ "name": name, "description": description, "required": true })
                })
                .collect();
            json!({
                "name": p.name,
                "title": p.title,
                "description": p.description,
                "arguments": arguments,
            })
        })
        .collect();
    json!({ "prompts": prompts })
}

/// `prompts/get {name, arguments}`.
pub fn get(params: &Map<String, Value>) -> Result<Value, RpcError> {
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    let Some(prompt) = PROMPTS.iter().find(|p| p.name == name) else {
        return Err(RpcError::new(
            INVALID_PARAMS,
            format!("no such prompt: {name}"),
        ));
    };
    let argument = |key: &str| {
        params
            .get("arguments")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| RpcError::new(INVALID_PARAMS, format!("argument {key} is required")))
    };
    let safety = format!(
        "This is a physical robot. Read {CONSTRAINTS_URI} first and stay within its limits; \
         call {ESTOP_TOOL} at once if anything looks unsafe or unexpected; never retry a \
         refused motion without understanding why."
    );
    let text = match prompt.name {
        "inspect_surroundings" => format!(
            "{safety}\n\nInspect the robot's surroundings without moving it: read its pose \
             ({RESOURCE_PREFIX}odometry) and status ({RESOURCE_PREFIX}status), call \
             capture_image and describe what you see, and list the saved locations \
             (list_locations). Report where the robot is, what is around it, and anything \
             that would make motion unsafe."
        ),
        _ => {
            let location = argument("location")?;
            format!(
                "{safety}\n\nTake the robot to the saved location \"{location}\" and report. \
                 Check with list_locations that it exists (if not, say so and stop). Call \
                 navigate_to with it and follow the call to its end. Then read the pose \
                 ({RESOURCE_PREFIX}odometry), call capture_image, and report where the robot \
                 is and what it sees. If navigation fails, report why; do not drive by hand \
                 instead."
            )
        }
    };
    Ok(json!({
        "description": prompt.description,
        "messages": [{ "role": "user", "content": { "type": "text", "text": text } }],
    }))
}
