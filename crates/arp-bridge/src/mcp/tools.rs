//! The parent's requests that wait on the robot (`tools/list`, `tools/call`,
//! `resources/list`, `resources/read`), each run in a task of its own.

use serde_json::{json, Map, Value};
use signalling_protocol::arp::{method, ArpCode};
use tokio::sync::{mpsc, watch};

use super::limits::{
    CANCEL_WAIT, CONSTRAINTS_URI, ESTOP_TOOL, RESOURCE_NOT_FOUND, RESOURCE_PREFIX,
};
use super::robot::{Robot, RobotError, StartedCall};
use super::shapes::{
    call_result, constraints_resource, error_result, estop_tool, mcp_resource, mcp_tool,
    text_result, VelocityLimit,
};
use crate::jsonrpc::{self, RpcError, INVALID_PARAMS};
use crate::parent::emit;

type Answer = Option<Result<Value, RpcError>>;

pub(super) async fn tools_list(robot: &Robot) -> Answer {
    // The limits are read with every listing, so a changed limit shows in the next one.
    let (listed, constraints) = tokio::join!(
        robot.request(method::LIST_TOOLS, json!({})),
        robot.request(method::LIST_CONSTRAINTS, json!({})),
    );
    let listed = match listed {
        Ok(listed) => listed,
        Err(e) => return Some(Err(e.to_rpc())),
    };
    let velocity = constraints
        .ok()
        .as_ref()
        .and_then(VelocityLimit::from_constraints);
    let arp_tools = listed
        .get("tools")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    robot.remember_tools(&arp_tools);
    let mut tools: Vec<Value> = arp_tools
        .iter()
        // The bridge's own emergency_stop wins over a same-named tool.
        .filter(|t| t.get("name").and_then(Value::as_str) != Some(ESTOP_TOOL))
        .filter_map(mcp_tool)
        .map(|mut tool| {
            if let Some(velocity) = &velocity {
                velocity.constrain(&mut tool);
            }
            tool
        })
        .collect();
    tools.push(estop_tool());
    Some(Ok(json!({ "tools": tools })))
}

pub(super) async fn resources_list(robot: &Robot) -> Answer {
    let listed = match robot.request(method::LIST_CONTEXT, json!({})).await {
        Ok(listed) => listed,
        Err(e) => return Some(Err(e.to_rpc())),
    };
    let mut resources: Vec<Value> = listed
        .get("sources")
        .and_then(Value::as_array)
        .map(|s| s.iter().filter_map(mcp_resource).collect())
        .unwrap_or_default();
    resources.push(constraints_resource());
    Some(Ok(json!({ "resources": resources })))
}

pub(super) async fn resources_read(robot: &Robot, params: &Map<String, Value>) -> Answer {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Some(Err(RpcError::new(
            INVALID_PARAMS,
            "uri: a string is required",
        )));
    };
    if uri == CONSTRAINTS_URI {
        return Some(
            match robot.request(method::LIST_CONSTRAINTS, json!({})).await {
                Ok(listed) => Ok(json!({
                    "contents": [{
                        "uri": uri,
                        "mimeType": "application/json",
                        "text": listed.to_string(),
                    }],
                })),
                Err(e) => Err(e.to_rpc()),
            },
        );
    }
    let Ok(name) = context_name(params) else {
        return Some(Err(not_found(uri)));
    };
    match robot.read_context(name).await {
        Ok(update) => Some(Ok(json!({
            "contents": [{
                "uri": uri,
                "mimeType": "application/json",
                "text": update.to_string(),
            }],
        }))),
        Err(RobotError::Arp(e)) if e.code == ArpCode::ContextNotFound.code() => {
            Some(Err(not_found(uri)))
        }
        Err(e) => Some(Err(e.to_rpc())),
    }
}

/// The context source a resource `uri` names (`arp://context/{name}`).
pub(super) fn context_name(params: &Map<String, Value>) -> Result<&str, RpcError> {
    let uri = params.get("uri").and_then(Value::as_str).unwrap_or("");
    match uri.strip_prefix(RESOURCE_PREFIX) {
        Some(name) if !name.is_empty() && !name.contains('/') => Ok(name),
        _ => Err(not_found(uri)),
    }
}

/// MCP's "resource not found".
fn not_found(uri: &str) -> RpcError {
    RpcError::new(RESOURCE_NOT_FOUND, format!("Resource not found: {uri}"))
        .with_data(json!({ "uri": uri }))
}

/// `resources/subscribe {uri}`: the source's updates become
/// `notifications/resources/updated` until `resources/unsubscribe`.
pub(super) async fn resources_subscribe(robot: &Robot, params: &Map<String, Value>) -> Answer {
    let name = match context_name(params) {
        Ok(name) => name,
        Err(e) => return Some(Err(e)),
    };
    match robot.subscribe(name).await {
        Ok(()) => Some(Ok(json!({}))),
        Err(RobotError::Arp(e)) if e.code == ArpCode::ContextNotFound.code() => {
            let uri = params.get("uri").and_then(Value::as_str).unwrap_or("");
            Some(Err(not_found(uri)))
        }
        Err(e) => Some(Err(e.to_rpc())),
    }
}

pub(super) async fn tools_call(
    robot: &Robot,
    out: &mpsc::Sender<String>,
    id: &Value,
    params: &Map<String, Value>,
    cancel: Option<watch::Receiver<bool>>,
) -> Answer {
    let (name, arguments) = match call_params(params) {
        Ok(call) => call,
        Err(e) => return Some(Err(e)),
    };
    if name == ESTOP_TOOL {
        return Some(emergency_stop(robot, &arguments).await);
    }
    let token = params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
        .cloned();
    // A retry with the same key runs once: the robot answers it with the first run's
    // outcome (ARP's `idempotencyKey`, remembered per subject).
    let key = params
        .get("_meta")
        .and_then(|m| m.get("idempotencyKey"))
        .and_then(Value::as_str);
    let mut call = match robot
        .start_call(name, arguments, key, token.is_some())
        .await
    {
        Ok(call) => call,
        Err(e) => return Some(Err(e.to_rpc())),
    };
    let answer = match follow(&mut call, out, token.as_ref(), cancel).await {
        Some(Ok(result)) => Some(call_result(name, Ok(result))),
        Some(Err(RobotError::Arp(e))) => Some(call_result(name, Err(e))),
        Some(Err(e)) => Some(Err(e.to_rpc())),
        None => {
            cancel_call(robot, &mut call, id).await;
            None
        }
    };
    robot.end_call(&call.arp_id);
    answer
}

/// `tools/call`'s tool name and arguments (an object; none is `{}`).
fn call_params(params: &Map<String, Value>) -> Result<(&str, Value), RpcError> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err(RpcError::new(INVALID_PARAMS, "name: a string is required"));
    };
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(a)) => Value::Object(a.clone()),
        Some(_) => {
            return Err(RpcError::new(
                INVALID_PARAMS,
                "arguments: must be an object",
            ))
        }
    };
    Ok((name, arguments))
}

/// The [`ESTOP_TOOL`]: `arp.emergencyStop`, at once.
async fn emergency_stop(robot: &Robot, arguments: &Value) -> Result<Value, RpcError> {
    let reason = arguments
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("emergency_stop (MCP)");
    let stop = robot
        .request(method::EMERGENCY_STOP, json!({ "reason": reason }))
        .await;
    match stop {
        Ok(result) => Ok(text_result(
            "Emergency stop sent: the robot halted and its e-stop is latched.".into(),
            result,
            false,
        )),
        Err(RobotError::Arp(e)) => Ok(error_result(&e)),
        Err(e) => Err(e.to_rpc()),
    }
}

/// Waits for a started call's end, relaying its progress to the parent
/// (with a progress `token`); `None` when the parent cancelled it.
async fn follow(
    call: &mut StartedCall,
    out: &mpsc::Sender<String>,
    token: Option<&Value>,
    mut cancel: Option<watch::Receiver<bool>>,
) -> Option<Result<Value, RobotError>> {
    let mut last = f64::NEG_INFINITY;
    loop {
        let progress = async {
            match call.progress.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let cancelled = async {
            match cancel.as_mut() {
                Some(rx) => rx.wait_for(|c| *c).await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            reply = &mut call.reply => return Some(reply.unwrap_or(Err(RobotError::Closed))),
            update = progress => match update {
                Some((p, message)) => {
                    // MCP wants progress to increase with each notification.
                    if p > last {
                        last = p;
                        if let Some(token) = token {
                            let mut params = json!({ "progressToken": token, "progress": p, "total": 1.0 });
                            if let Some(m) = message {
                                params["message"] = json!(m);
                            }
                            emit(out, jsonrpc::notification("notifications/progress", params)).await;
                        }
                    }
                }
                None => call.progress = None,
            },
            still = cancelled => {
                if still {
                    return None;
                }
                cancel = None;
            }
        }
    }
}

/// `notifications/cancelled` for a running call: `arp.cancelTool` once the
/// callId is known, then the call's end is awaited (and not reported).
async fn cancel_call(robot: &Robot, call: &mut StartedCall, id: &Value) {
    let ended = async {
        let call_id = tokio::select! {
            _ = &mut call.reply => return,
            known = call.known.wait_for(Option::is_some) => known.ok().and_then(|k| (*k).clone()),
        };
        if let Some(call_id) = call_id {
            let _ = robot
                .request(method::CANCEL_TOOL, json!({ "callId": call_id }))
                .await;
        }
        let _ = (&mut call.reply).await;
    };
    if tokio::time::timeout(CANCEL_WAIT, ended).await.is_err() {
        eprintln!("arp-bridge: the cancelled call of request {id} did not end in time");
    }
}
