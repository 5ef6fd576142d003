//! The tools of a mobile base (arp-contract.md), their JSON Schema
//! parameters and safety metadata, and their typed arguments.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ArpError;

/// Longest accepted `drive`.
pub const MAX_DRIVE_SECS: f64 = 30.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    Drive,
    Stop,
    NavigateTo,
    CancelNavigation,
    SaveLocation,
    ListLocations,
    ResetEmergencyStop,
}

impl ToolKind {
    /// Tools that make the robot move: refused while the e-stop is latched,
    /// one at a time.
    pub fn moves(self) -> bool {
        matches!(self, ToolKind::Drive | ToolKind::NavigateTo)
    }

    /// Tools a viewer may call: reading only.
    pub fn viewer_may_call(self) -> bool {
        matches!(self, ToolKind::ListLocations)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Normal,
    Elevated,
    Critical,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Normal => "normal",
            Level::Elevated => "elevated",
            Level::Critical => "critical",
        }
    }
}

/// One tool as listed.
#[derive(Debug, Clone)]
pub struct Tool {
    pub name: &'static str,
    pub kind: ToolKind,
    pub description: &'static str,
    pub parameters: Value,
    pub level: Level,
    pub reversible: bool,
    pub safety_note: &'static str,
    pub estimated_duration: Option<f64>,
    pub requires_confirmation: bool,
}

impl Tool {
    pub fn to_json(&self) -> Value {
        let mut tool = json!({
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "safety": {
                "level": self.level.as_str(),
                "requiresConfirmation": self.requires_confirmation,
                "reversible": self.reversible,
                "description": self.safety_note,
            },
        });
        if let Some(d) = self.estimated_duration {
            tool["estimatedDuration"] = json!(d);
        }
        tool
    }
}

fn no_arguments() -> Value {
    json!({ "type": "object", "properties": {}, "additionalProperties": false })
}

/// The catalogue; `confirm` overrides `requiresConfirmation` per tool
/// (`[arp.confirm]` in agent.toml). Every tool defaults to off.
pub fn catalogue(confirm: &HashMap<String, bool>) -> Vec<Tool> {
    let tools = vec![
        Tool {
            name: "drive",
            kind: ToolKind::Drive,
            description: "Drive the base at a constant velocity for a while, then stop. \
                          Progress is reported every 10 %.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "linear": { "type": "number", "description": "forward speed, m/s (negative: backwards)" },
                    "angular": { "type": "number", "description": "turn rate, rad/s (positive: left)" },
                    "durationSecs": { "type": "number", "exclusiveMinimum": 0, "maximum": MAX_DRIVE_SECS },
                },
                "required": ["linear", "angular", "durationSecs"],
                "additionalProperties": false,
            }),
            level: Level::Elevated,
            reversible: true,
            safety_note: "Moves the base; velocity limits, the workspace and the e-stop apply",
            estimated_duration: None,
            requires_confirmation: false,
        },
        Tool {
            name: "stop",
            kind: ToolKind::Stop,
            description: "Stop the base now; a running drive ends as cancelled.",
            parameters: no_arguments(),
            level: Level::Normal,
            reversible: true,
            safety_note: "Stops motion",
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
        Tool {
            name: "navigate_to",
            kind: ToolKind::NavigateTo,
            description: "Navigate to a saved location (see list_locations).",
            parameters: json!({
                "type": "object",
                "properties": {
                    "location": { "type": "string", "minLength": 1, "description": "name of a saved location" },
                },
                "required": ["location"],
                "additionalProperties": false,
            }),
            level: Level::Elevated,
            reversible: true,
            safety_note: "Moves the base autonomously; the workspace and the e-stop apply",
            estimated_duration: None,
            requires_confirmation: false,
        },
        Tool {
            name: "cancel_navigation",
            kind: ToolKind::CancelNavigation,
            description: "Cancel the navigation in progress.",
            parameters: no_arguments(),
            level: Level::Normal,
            reversible: true,
            safety_note: "Stops autonomous motion",
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
        Tool {
            name: "save_location",
            kind: ToolKind::SaveLocation,
            description: "Save the current pose under a name, for navigate_to.",
            parameters: json!({
                "type": "object",
                "properties": { "name": { "type": "string", "minLength": 1, "maxLength": 64 } },
                "required": ["name"],
                "additionalProperties": false,
            }),
            level: Level::Normal,
            reversible: true,
            safety_note: "Stores data; does not move",
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
        Tool {
            name: "list_locations",
            kind: ToolKind::ListLocations,
            description: "List the saved locations.",
            parameters: no_arguments(),
            level: Level::Normal,
            reversible: true,
            safety_note: "Reads data; does not move",
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
        Tool {
            name: "reset_emergency_stop",
            kind: ToolKind::ResetEmergencyStop,
            description: "Release a latched emergency stop (operator only). Motion is \
                          possible again afterwards.",
            parameters: no_arguments(),
            level: Level::Elevated,
            reversible: false,
            safety_note: "Re-enables motion after an emergency stop",
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
    ];
    tools
        .into_iter()
        .map(|mut tool| {
            if let Some(on) = confirm.get(tool.name) {
                tool.requires_confirmation = *on;
            }
            tool
        })
        .collect()
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DriveArgs {
    pub linear: f64,
    pub angular: f64,
    pub duration_secs: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NavigateArgs {
    pub location: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaveArgs {
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// A tool's arguments, checked.
#[derive(Debug, Clone)]
pub enum Args {
    Drive(DriveArgs),
    Navigate(NavigateArgs),
    Save(SaveArgs),
    None,
}

fn parse<T: serde::de::DeserializeOwned>(arguments: &Value) -> Result<T, ArpError> {
    serde_path_to_error::deserialize(arguments).map_err(|e| ArpError::params("arguments", e))
}

fn invalid(field: &str, message: &str) -> ArpError {
    ArpError::InvalidParams {
        field: Some(format!("arguments.{field}")),
        message: format!("arguments.{field}: {message}"),
    }
}

/// Checks `arguments` against the tool's parameters.
pub fn parse_args(kind: ToolKind, arguments: &Value) -> Result<Args, ArpError> {
    Ok(match kind {
        ToolKind::Drive => {
            let args: DriveArgs = parse(arguments)?;
            if !args.linear.is_finite() {
                return Err(invalid("linear", "must be a finite number"));
            }
            if !args.angular.is_finite() {
                return Err(invalid("angular", "must be a finite number"));
            }
            if !(args.duration_secs > 0.0 && args.duration_secs <= MAX_DRIVE_SECS) {
                return Err(invalid(
                    "durationSecs",
                    &format!("must be > 0 and <= {MAX_DRIVE_SECS}"),
                ));
            }
            Args::Drive(args)
        }
        ToolKind::NavigateTo => Args::Navigate(parse(arguments)?),
        ToolKind::SaveLocation => Args::Save(parse(arguments)?),
        ToolKind::Stop
        | ToolKind::CancelNavigation
        | ToolKind::ListLocations
        | ToolKind::ResetEmergencyStop => {
            let _: NoArgs = parse(arguments)?;
            Args::None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drive_arguments_are_checked() {
        assert!(parse_args(
            ToolKind::Drive,
            &json!({"linear": 0.2, "angular": 0, "durationSecs": 1})
        )
        .is_ok());
        for (bad, field) in [
            (
                json!({"linear": 0.2, "angular": 0}),
                "arguments.durationSecs",
            ),
            (
                json!({"linear": 0.2, "angular": 0, "durationSecs": 31}),
                "arguments.durationSecs",
            ),
            (
                json!({"linear": "x", "angular": 0, "durationSecs": 1}),
                "arguments.linear",
            ),
            (
                json!({"linear": 0, "angular": 0, "durationSecs": 1, "turbo": true}),
                "arguments.turbo",
            ),
        ] {
            match parse_args(ToolKind::Drive, &bad) {
                Err(ArpError::InvalidParams { field: Some(f), .. }) => assert_eq!(f, field),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(parse_args(ToolKind::Stop, &json!({"x": 1})).is_err());
    }

    #[test]
    fn confirmation_is_configurable_per_tool() {
        let on = HashMap::from([("navigate_to".to_owned(), true)]);
        let tools = catalogue(&on);
        let nav = tools
            .iter()
            .find(|t| t.name == "navigate_to")
            .expect("tool");
        assert!(nav.requires_confirmation);
        assert!(catalogue(&HashMap::new())
            .iter()
            .all(|t| !t.requires_confirmation));
    }
}
