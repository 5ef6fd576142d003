//! One ARP message, typed: a JSON-RPC 2.0 request, notification or response. A frame is
//! parsed once (into a `serde_json::Value`, which the schema check reads), turned into a
//! [`Message`] by moving its members, and written once ([`Message::to_text`]).

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use super::{method, FRAME_SIGNATURE_KEY};

/// One JSON-RPC message of ARP.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// `id`: `None` for a notification (a response always has one, `null` included).
    pub id: Option<Value>,
    pub body: Body,
    /// The robot's signature of this frame, as the program that asked for it receives it
    /// (top-level [`FRAME_SIGNATURE_KEY`]); between robot and server it travels in the
    /// `arp.frame`'s `meta`.
    pub signature: Option<Value>,
}

/// What a message says.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// A request (with an id) or a notification (without).
    Request {
        method: String,
        params: Option<Value>,
    },
    /// A success: `result`.
    Result(Value),
    /// A failure: the `error` object (`code`, `message`, `data`), as sent.
    Error(Value),
}

/// Why a JSON value is not one ARP message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("a JSON-RPC message is an object")]
    NotAnObject,
    #[error("batches are not supported: send one request per frame")]
    Batch,
    #[error("method is not a string")]
    Method,
    #[error("neither a request (method) nor a response (result or error)")]
    Shape,
}

impl Message {
    /// A request (`id` given) or a notification.
    pub fn request(id: Option<Value>, method: impl Into<String>, params: Option<Value>) -> Self {
        Message {
            id,
            body: Body::Request {
                method: method.into(),
                params,
            },
            signature: None,
        }
    }

    /// A success response.
    pub fn result(id: Value, result: Value) -> Self {
        Message {
            id: Some(id),
            body: Body::Result(result),
            signature: None,
        }
    }

    /// A failure response: `error` is `{"code", "message", "data"?}`.
    pub fn error(id: Value, error: Value) -> Self {
        Message {
            id: Some(id),
            body: Body::Error(error),
            signature: None,
        }
    }

    /// The message a parsed frame holds, its members moved (nothing is parsed again).
    /// `jsonrpc` is not read (the schema check is the place for it); members ARP does not
    /// define are left out.
    pub fn from_value(value: Value) -> Result<Message, MessageError> {
        let mut object = match value {
            Value::Object(object) => object,
            Value::Array(_) => return Err(MessageError::Batch),
            _ => return Err(MessageError::NotAnObject),
        };
        let id = object.remove("id");
        let signature = object.remove(FRAME_SIGNATURE_KEY);
        let body = match object.remove("method") {
            Some(Value::String(method)) => Body::Request {
                method,
                params: object.remove("params"),
            },
            Some(_) => return Err(MessageError::Method),
            None => match (object.remove("result"), object.remove("error")) {
                (_, Some(error)) => Body::Error(error),
                (Some(result), None) => Body::Result(result),
                (None, None) => return Err(MessageError::Shape),
            },
        };
        Ok(Message {
            id,
            body,
            signature,
        })
    }

    /// The message's JSON text: written once, in the order JSON-RPC lists its members.
    pub fn to_text(&self) -> String {
        // Strings and JSON values always serialise.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The method of a request or notification.
    pub fn method(&self) -> Option<&str> {
        match &self.body {
            Body::Request { method, .. } => Some(method),
            _ => None,
        }
    }

    /// The params of a request or notification.
    pub fn params(&self) -> Option<&Value> {
        match &self.body {
            Body::Request { params, .. } => params.as_ref(),
            _ => None,
        }
    }

    /// The params object, to change.
    pub fn params_mut(&mut self) -> Option<&mut Map<String, Value>> {
        match &mut self.body {
            Body::Request { params, .. } => params.as_mut().and_then(Value::as_object_mut),
            _ => None,
        }
    }

    /// The id of a request (a notification and a response have none to answer).
    pub fn request_id(&self) -> Option<&Value> {
        match self.body {
            Body::Request { .. } => self.id.as_ref(),
            _ => None,
        }
    }

    pub fn is_request(&self) -> bool {
        matches!(self.body, Body::Request { .. })
    }

    /// An `arp.callTool`, whose ticket must carry the hash of its params.
    pub fn is_tool_call(&self) -> bool {
        self.method() == Some(method::CALL_TOOL)
    }

    /// The `result` of a success.
    pub fn result_value(&self) -> Option<&Value> {
        match &self.body {
            Body::Result(result) => Some(result),
            _ => None,
        }
    }

    /// The `result` of a success, to change.
    pub fn result_mut(&mut self) -> Option<&mut Map<String, Value>> {
        match &mut self.body {
            Body::Result(result) => result.as_object_mut(),
            _ => None,
        }
    }

    /// The `error` object of a failure.
    pub fn error_value(&self) -> Option<&Value> {
        match &self.body {
            Body::Error(error) => Some(error),
            _ => None,
        }
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("jsonrpc", "2.0")?;
        if let Some(id) = &self.id {
            map.serialize_entry("id", id)?;
        }
        match &self.body {
            Body::Request { method, params } => {
                map.serialize_entry("method", method)?;
                if let Some(params) = params {
                    map.serialize_entry("params", params)?;
                }
            }
            Body::Result(result) => map.serialize_entry("result", result)?,
            Body::Error(error) => map.serialize_entry("error", error)?,
        }
        if let Some(signature) = &self.signature {
            map.serialize_entry(FRAME_SIGNATURE_KEY, signature)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_request_reads_and_writes_back_the_same_json() {
        let value = json!({"jsonrpc": "2.0", "id": 7, "method": "arp.callTool",
            "params": {"name": "drive", "arguments": {"x": 1.5}}});
        let message = Message::from_value(value.clone()).expect("a request");
        assert_eq!(message.method(), Some(method::CALL_TOOL));
        assert!(message.is_tool_call());
        assert_eq!(message.request_id(), Some(&json!(7)));
        let written: Value = serde_json::from_str(&message.to_text()).expect("JSON");
        assert_eq!(written, value);
        assert!(message
            .to_text()
            .starts_with(r#"{"jsonrpc":"2.0","id":7,"method""#));
    }

    #[test]
    fn responses_notifications_and_signatures_keep_their_members() {
        for value in [
            json!({"jsonrpc": "2.0", "id": "a", "result": {"state": "completed"}}),
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "x"}}),
            json!({"jsonrpc": "2.0", "method": "arp.contextUpdate", "params": {}}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {}, "signature": "h..s"}),
        ] {
            let message = Message::from_value(value.clone()).expect("a message");
            let written: Value = serde_json::from_str(&message.to_text()).expect("JSON");
            assert_eq!(written, value);
        }
        let notification =
            Message::from_value(json!({"jsonrpc": "2.0", "method": "arp.shutdown"})).unwrap();
        assert_eq!(notification.request_id(), None);
        let answer = Message::from_value(json!({"jsonrpc": "2.0", "id": 1, "result": {}})).unwrap();
        assert_eq!(answer.request_id(), None);
    }

    #[test]
    fn what_is_not_one_message_is_refused() {
        assert_eq!(Message::from_value(json!([1])), Err(MessageError::Batch));
        assert_eq!(
            Message::from_value(json!("x")),
            Err(MessageError::NotAnObject)
        );
        assert_eq!(
            Message::from_value(json!({"jsonrpc": "2.0", "method": 3})),
            Err(MessageError::Method)
        );
        assert_eq!(
            Message::from_value(json!({"jsonrpc": "2.0", "id": 1})),
            Err(MessageError::Shape)
        );
    }
}
