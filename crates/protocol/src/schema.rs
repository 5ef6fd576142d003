//! Validation of whole messages against the spec's JSON Schemas (feature
//! `schema`).
//!
//! The schemas are compiled into the binary with `include_str!`, so tests
//! of any crate can use this without knowing where the spec lives.

use std::collections::HashMap;
use std::sync::OnceLock;

use jsonschema::{Draft, Resource, Validator};
use serde_json::Value;

macro_rules! spec {
    ($path:literal) => {
        include_str!(concat!("../spec/schemas/", $path))
    };
}

/// Schemas that are only referenced, never used for a message directly.
const SHARED: &[&str] = &[
    spec!("common/v0/envelope.json"),
    spec!("common/v0/location.json"),
];

/// Message type → its schema.
const MESSAGES: &[(&str, &str)] = &[
    ("signalling.answer", spec!("signalling/v0/answer.json")),
    (
        "signalling.capabilities",
        spec!("signalling/v0/capabilities.json"),
    ),
    (
        "signalling.connected",
        spec!("signalling/v0/connected.json"),
    ),
    (
        "signalling.disconnected",
        spec!("signalling/v0/disconnected.json"),
    ),
    ("signalling.error", spec!("signalling/v0/error.json")),
    (
        "signalling.ice_candidate",
        spec!("signalling/v0/ice_candidate.json"),
    ),
    ("signalling.offer", spec!("signalling/v0/offer.json")),
    ("signalling.ping", spec!("signalling/v0/ping.json")),
    ("signalling.pong", spec!("signalling/v0/pong.json")),
    (
        "signalling.pki_challenge",
        spec!("signalling/v0/pki_challenge.json"),
    ),
    (
        "signalling.pki_response",
        spec!("signalling/v0/pki_response.json"),
    ),
    (
        "signalling.pki_verified",
        spec!("signalling/v0/pki_verified.json"),
    ),
    ("signalling.register", spec!("signalling/v0/register.json")),
    ("signalling.welcome", spec!("signalling/v0/welcome.json")),
    ("agent.capabilities", spec!("agent/v0/capabilities.json")),
    ("agent.config.get", spec!("agent/v0/config/get.json")),
    (
        "agent.config.get.response",
        spec!("agent/v0/config/get/response.json"),
    ),
    (
        "agent.config.response",
        spec!("agent/v0/config/response.json"),
    ),
    ("agent.config.update", spec!("agent/v0/config/update.json")),
    ("agent.error", spec!("agent/v0/error.json")),
    (
        "agent.location.create",
        spec!("agent/v0/location/create.json"),
    ),
    (
        "agent.location.delete",
        spec!("agent/v0/location/delete.json"),
    ),
    ("agent.location.list", spec!("agent/v0/location/list.json")),
    (
        "agent.location.response",
        spec!("agent/v0/location/response.json"),
    ),
    (
        "agent.location.update",
        spec!("agent/v0/location/update.json"),
    ),
    ("agent.movement", spec!("agent/v0/movement.json")),
    (
        "agent.navigation.cancel",
        spec!("agent/v0/navigation/cancel.json"),
    ),
    (
        "agent.navigation.response",
        spec!("agent/v0/navigation/response.json"),
    ),
    (
        "agent.navigation.start",
        spec!("agent/v0/navigation/start.json"),
    ),
    ("agent.ping", spec!("agent/v0/ping.json")),
    ("agent.pong", spec!("agent/v0/pong.json")),
];

/// Compiled validators for every message type of the spec.
pub struct SchemaValidator {
    validators: HashMap<&'static str, Validator>,
}

impl SchemaValidator {
    /// Compiles every bundled schema, with relative `$ref`s resolved by
    /// registering each schema under its `$id`.
    ///
    /// # Panics
    /// If a bundled schema is broken, which the crate's tests rule out.
    pub fn new() -> Self {
        match Self::try_new() {
            Ok(v) => v,
            Err(e) => panic!("bundled spec schemas do not compile: {e}"),
        }
    }

    /// A process-wide instance, compiled once; handy in tests.
    pub fn shared() -> &'static SchemaValidator {
        static SHARED_VALIDATOR: OnceLock<SchemaValidator> = OnceLock::new();
        SHARED_VALIDATOR.get_or_init(SchemaValidator::new)
    }

    /// Like [`SchemaValidator::new`], reporting instead of panicking.
    pub fn try_new() -> Result<Self, String> {
        let mut documents = Vec::new();
        for source in SHARED.iter().chain(MESSAGES.iter().map(|(_, s)| s)) {
            let schema: Value =
                serde_json::from_str(source).map_err(|e| format!("schema is not JSON: {e}"))?;
            let id = schema
                .get("$id")
                .and_then(Value::as_str)
                .ok_or("schema has no $id")?
                .to_owned();
            documents.push((id, schema));
        }

        let mut validators = HashMap::new();
        for (kind, source) in MESSAGES {
            let schema: Value = serde_json::from_str(source).map_err(|e| e.to_string())?;
            let mut options = jsonschema::options()
                .with_draft(Draft::Draft202012)
                .should_validate_formats(true);
            for (id, doc) in &documents {
                let resource =
                    Resource::from_contents(doc.clone()).map_err(|e| format!("{id}: {e}"))?;
                options = options.with_resource(id.clone(), resource);
            }
            let validator = options.build(&schema).map_err(|e| format!("{kind}: {e}"))?;
            validators.insert(*kind, validator);
        }
        Ok(Self { validators })
    }

    /// Whether a schema exists for message type `kind`.
    pub fn has_schema(&self, kind: &str) -> bool {
        self.validators.contains_key(kind)
    }

    /// Validates a message against the schema of its `type`, reporting every
    /// violation (one per line, prefixed with its JSON pointer).
    pub fn validate(&self, message: &Value) -> Result<(), String> {
        let kind = message
            .get("type")
            .and_then(Value::as_str)
            .ok_or("message has no string `type`")?;
        let validator = self
            .validators
            .get(kind)
            .ok_or_else(|| format!("no schema for message type {kind:?}"))?;
        let errors: Vec<String> = validator
            .iter_errors(message)
            .map(|e| format!("{kind} at {:?}: {e}", e.instance_path.as_str()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n"))
        }
    }

    /// Like [`SchemaValidator::validate`], for message text.
    pub fn validate_str(&self, text: &str) -> Result<(), String> {
        let message: Value =
            serde_json::from_str(text).map_err(|e| format!("message is not JSON: {e}"))?;
        self.validate(&message)
    }
}

impl Default for SchemaValidator {
    fn default() -> Self {
        Self::new()
    }
}
