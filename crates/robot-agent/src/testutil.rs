//! Helpers shared by the unit tests.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use signalling_protocol::schema::SchemaValidator;
use signalling_protocol::Envelope;

/// Upper bound of any wait in a test; never used as synchronisation.
pub const WAIT: Duration = Duration::from_secs(10);

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "robot-agent-test-{tag}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Serialises an outgoing message and checks it against the spec's schema.
pub fn validated(envelope: &Envelope) -> Value {
    let value: Value = serde_json::from_str(&envelope.to_json()).expect("agent sent JSON");
    if let Err(e) = SchemaValidator::shared().validate(&value) {
        panic!("agent sent a message that breaks the spec: {e}\n{value}");
    }
    value
}
