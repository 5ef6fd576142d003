//! JSON-RPC 2.0 framing shared by both modes: building messages and
//! sorting one incoming line into a request, a notification or a response.

use serde_json::{json, Map, Value};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

pub fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

pub fn request(id: &Value, method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

pub fn result(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

pub fn error(id: &Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut error = json!({ "code": code, "message": message });
    if let Some(data) = data {
        error["data"] = data;
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

/// The bridge's refusal of a request because `limit` of something is reached.
pub fn over_limit(id: &Value, message: &str, limit: usize) -> Value {
    error(id, INTERNAL_ERROR, message, Some(json!({ "limit": limit })))
}

/// A JSON-RPC error object as received.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    /// Reads an `error` member; a malformed one is still an error (an
    /// internal one), never a success.
    pub fn from_value(error: &Value) -> RpcError {
        RpcError {
            code: error
                .get("code")
                .and_then(Value::as_i64)
                .unwrap_or(INTERNAL_ERROR),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("malformed error")
                .to_owned(),
            data: error.get("data").cloned(),
        }
    }

    pub fn to_response(&self, id: &Value) -> Value {
        error(id, self.code, &self.message, self.data.clone())
    }
}

/// Why a line is not a message we can handle; each answers with `id`
/// null (no id can be trusted from it).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FrameError {
    #[error("parse error: {0}")]
    Parse(String),
    #[error("batches are not supported: send one JSON object per line")]
    Batch,
    #[error("a message is a JSON object")]
    NotObject,
    #[error("frame larger than {0} bytes")]
    TooLarge(usize),
}

impl FrameError {
    pub fn code(&self) -> i64 {
        match self {
            FrameError::Parse(_) => PARSE_ERROR,
            _ => INVALID_REQUEST,
        }
    }

    pub fn to_response(&self) -> Value {
        let data = match self {
            FrameError::TooLarge(limit) => Some(json!({ "limit": limit })),
            _ => None,
        };
        error(&Value::Null, self.code(), &self.to_string(), data)
    }
}

/// Parses one line into a JSON object: no batches, nothing but objects.
pub fn parse_object(text: &str) -> Result<Map<String, Value>, FrameError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(Value::Array(_)) => Err(FrameError::Batch),
        Ok(_) => Err(FrameError::NotObject),
        Err(e) => Err(FrameError::Parse(e.to_string())),
    }
}

/// One message, sorted by shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    Response {
        id: Value,
        outcome: Result<Value, RpcError>,
    },
    /// Not a valid JSON-RPC 2.0 message; `id` is the one to answer with.
    Invalid {
        id: Value,
        why: String,
    },
}

fn valid_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

impl Message {
    pub fn from_object(mut m: Map<String, Value>) -> Message {
        let id = m.remove("id");
        let reply_id = id.clone().filter(valid_id).unwrap_or(Value::Null);
        let invalid = |why: &str| Message::Invalid {
            id: reply_id.clone(),
            why: why.to_owned(),
        };
        if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return invalid("jsonrpc must be \"2.0\"");
        }
        if id.as_ref().is_some_and(|id| !valid_id(id)) {
            return invalid("id must be a string or an integer");
        }
        match m.remove("method") {
            Some(Value::String(method)) => {
                let params = m.remove("params").unwrap_or_else(|| json!({}));
                match id {
                    Some(id) => Message::Request { id, method, params },
                    None => Message::Notification { method, params },
                }
            }
            Some(_) => invalid("method must be a string"),
            None => {
                let Some(id) = id else {
                    return invalid("a message needs a method or an id");
                };
                if let Some(error) = m.get("error") {
                    Message::Response {
                        id,
                        outcome: Err(RpcError::from_value(error)),
                    }
                } else if let Some(result) = m.remove("result") {
                    Message::Response {
                        id,
                        outcome: Ok(result),
                    }
                } else {
                    invalid("a response needs a result or an error")
                }
            }
        }
    }
}

/// A map key for an id: `"7"` and `7` are different ids.
pub fn id_key(id: &Value) -> String {
    id.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_sorted_and_refused() {
        assert_eq!(parse_object("[1]"), Err(FrameError::Batch));
        assert_eq!(parse_object("3"), Err(FrameError::NotObject));
        assert!(matches!(parse_object("{"), Err(FrameError::Parse(_))));
        let req = parse_object(r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#).unwrap();
        assert!(matches!(
            Message::from_object(req),
            Message::Request { method, .. } if method == "m"
        ));
        let n = parse_object(r#"{"jsonrpc":"2.0","method":"n","params":{"a":1}}"#).unwrap();
        assert!(matches!(
            Message::from_object(n),
            Message::Notification { .. }
        ));
        let e =
            parse_object(r#"{"jsonrpc":"2.0","id":"x","error":{"code":-40001,"message":"no"}}"#)
                .unwrap();
        match Message::from_object(e) {
            Message::Response {
                outcome: Err(e), ..
            } => assert_eq!(e.code, -40001),
            other => panic!("{other:?}"),
        }
        let bad = parse_object(r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#).unwrap();
        assert!(matches!(
            Message::from_object(bad),
            Message::Invalid {
                id: Value::Null,
                ..
            }
        ));
        let old = parse_object(r#"{"jsonrpc":"1.0","id":2,"method":"m"}"#).unwrap();
        assert!(matches!(Message::from_object(old), Message::Invalid { id, .. } if id == 2));
        assert_ne!(id_key(&json!(7)), id_key(&json!("7")));
        assert_eq!(
            FrameError::Parse("x".into()).to_response()["error"]["code"],
            -32700
        );
    }
}
