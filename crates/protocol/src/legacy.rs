//! Legacy data-channel form of a movement command, as the deployed Modulr
//! teleop web app sends it on its `control` channel:
//! `{"type":"MovementCommand","params":{"forward":x,"turn":z}}`.
//!
//! It has no envelope: no `id`, no `version` and, importantly for a robot,
//! no `timestamp`, so a receiver cannot tell its age from the message.

use serde::Deserialize;
use serde_json::Value;

use crate::agent::MovementPayload;
use crate::error::ProtocolError;

/// The legacy `type` of a movement command.
pub const LEGACY_MOVEMENT_TYPE: &str = "MovementCommand";

#[derive(Deserialize)]
struct Legacy {
    params: MovementPayload,
}

/// `None` if `text` is not a legacy movement command (it may be a spec
/// envelope); otherwise its checked payload, or why it is invalid.
pub fn parse_legacy_movement(text: &str) -> Option<Result<MovementPayload, ProtocolError>> {
    // Cheap test first: every data-channel message passes through here.
    if !text.contains(LEGACY_MOVEMENT_TYPE) {
        return None;
    }
    let value: Value = serde_json::from_str(text).ok()?;
    if value.get("type").and_then(Value::as_str) != Some(LEGACY_MOVEMENT_TYPE) {
        return None;
    }
    let parsed = Legacy::deserialize(&value)
        .map_err(|e| ProtocolError::InvalidPayload(format!("{LEGACY_MOVEMENT_TYPE}: {e}")))
        .and_then(|legacy| legacy.params.validate().map(|()| legacy.params));
    Some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_web_app_form() {
        let m = parse_legacy_movement(
            r#"{"type":"MovementCommand","params":{"forward":0.5,"turn":-0.25}}"#,
        )
        .expect("legacy")
        .expect("valid");
        assert_eq!(
            m,
            MovementPayload {
                forward: 0.5,
                turn: -0.25
            }
        );
    }

    #[test]
    fn other_messages_are_not_legacy_movement() {
        for text in [
            r#"{"type":"agent.movement","version":"0.5","id":"x","timestamp":"2026-01-06T12:00:00Z","payload":{"forward":0,"turn":0}}"#,
            r#"{"type":"ready"}"#,
            "not json",
            "[]",
        ] {
            assert!(parse_legacy_movement(text).is_none(), "{text}");
        }
    }

    #[test]
    fn bad_params_are_invalid_payload() {
        for text in [
            r#"{"type":"MovementCommand"}"#,
            r#"{"type":"MovementCommand","params":{"forward":2.0,"turn":0}}"#,
            r#"{"type":"MovementCommand","params":{"forward":"fast","turn":0}}"#,
            r#"{"type":"MovementCommand","params":{"forward":0.1}}"#,
            r#"{"type":"MovementCommand","params":{"forward":0.1,"turn":0,"boost":1}}"#,
        ] {
            let err = parse_legacy_movement(text)
                .expect("recognised as legacy")
                .expect_err("invalid");
            assert!(
                matches!(err, ProtocolError::InvalidPayload(_)),
                "{text}: {err:?}"
            );
        }
    }
}
