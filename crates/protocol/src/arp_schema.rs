//! Validation of ARP messages against `schemas/arp/arp-0.1.0.schema.json`
//! (feature `schema`): the envelope (request, notification, response)
//! and, where the method is known, the body of that method.

use std::collections::HashMap;
use std::sync::OnceLock;

use jsonschema::{Draft, Resource, Validator};
use serde_json::{json, Value};

use crate::arp::{method, SCHEMA};

const SCHEMA_ID: &str = "urn:arp:0.1.0";

/// Compiled validators for every definition of the ARP schema.
pub struct ArpValidator {
    defs: HashMap<String, Validator>,
}

impl ArpValidator {
    /// Compiles the bundled schema.
    ///
    /// # Panics
    /// If the bundled schema is broken, which the crate's tests rule out.
    pub fn new() -> Self {
        match Self::try_new() {
            Ok(v) => v,
            Err(e) => panic!("bundled ARP schema does not compile: {e}"),
        }
    }

    /// A process-wide instance, compiled once.
    pub fn shared() -> &'static ArpValidator {
        static SHARED: OnceLock<ArpValidator> = OnceLock::new();
        SHARED.get_or_init(ArpValidator::new)
    }

    pub fn try_new() -> Result<Self, String> {
        let schema: Value = serde_json::from_str(SCHEMA).map_err(|e| e.to_string())?;
        let names: Vec<String> = schema
            .get("$defs")
            .and_then(Value::as_object)
            .ok_or("schema has no $defs")?
            .keys()
            .cloned()
            .collect();
        let mut defs = HashMap::new();
        for name in names {
            let resource = Resource::from_contents(schema.clone()).map_err(|e| e.to_string())?;
            let validator = jsonschema::options()
                .with_draft(Draft::Draft202012)
                .should_validate_formats(true)
                .with_resource(SCHEMA_ID, resource)
                .build(&json!({ "$ref": format!("{SCHEMA_ID}#/$defs/{name}") }))
                .map_err(|e| format!("{name}: {e}"))?;
            defs.insert(name, validator);
        }
        Ok(ArpValidator { defs })
    }

    /// Whether the schema defines the params (or result) of `method`.
    pub fn knows(&self, method: &str) -> bool {
        self.defs.contains_key(&format!("{method}.params"))
    }

    /// Checks `value` against definition `def` (e.g. `Tool`,
    /// `arp.callTool.params`).
    pub fn check(&self, def: &str, value: &Value) -> Result<(), String> {
        let validator = self
            .defs
            .get(def)
            .ok_or_else(|| format!("the ARP schema has no definition {def:?}"))?;
        // Nearly every frame is valid: the yes-or-no check stops at nothing and builds no
        // error; only a frame it refuses is walked again for the errors to tell.
        if validator.is_valid(value) {
            return Ok(());
        }
        let errors: Vec<String> = validator
            .iter_errors(value)
            .map(|e| format!("{def} at {:?}: {e}", e.instance_path.as_str()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n"))
        }
    }

    /// Validates one message. A request or notification is checked with
    /// its method's params; a response with the result of `answered` (the
    /// method of the request it answers), when given. A failed
    /// `arp.callTool` must carry `{callId, state: "failed"}` in its data
    /// when `answered` is `arp.callTool` and the error has data.
    pub fn validate(&self, message: &Value, answered: Option<&str>) -> Result<(), String> {
        let Some(object) = message.as_object() else {
            return Err("an ARP message is a JSON object (no batches)".into());
        };
        if let Some(name) = object.get("method").and_then(Value::as_str) {
            let envelope = if object.contains_key("id") {
                "request"
            } else {
                "notification"
            };
            self.check(envelope, message)?;
            if !self.knows(name) {
                return Err(format!("{name:?} is not a method of ARP 0.1.0"));
            }
            let empty = json!({});
            let params = object.get("params").unwrap_or(&empty);
            return self.check(&format!("{name}.params"), params);
        }
        if object.contains_key("error") {
            self.check("failure", message)?;
            if answered == Some(method::CALL_TOOL) {
                if let Some(data) = message.pointer("/error/data") {
                    let code = message.pointer("/error/code").and_then(Value::as_i64);
                    // Only an error after the call started has a callId.
                    if data.get("callId").is_some() || code == Some(-40007) {
                        self.check("callFailure", data)?;
                    }
                }
            }
            return Ok(());
        }
        self.check("success", message)?;
        match answered {
            Some(name) => self.check(&format!("{name}.result"), &message["result"]),
            None => Ok(()),
        }
    }

    /// Like [`ArpValidator::validate`], for message text.
    pub fn validate_str(&self, text: &str, answered: Option<&str>) -> Result<Value, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        self.validate(&value, answered)?;
        Ok(value)
    }
}

impl Default for ArpValidator {
    fn default() -> Self {
        Self::new()
    }
}
