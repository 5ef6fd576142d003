//! The tools of a mobile base (arp-contract.md), their JSON Schema
//! parameters and safety metadata, and their typed arguments.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ArpError;
use crate::driver::DeclaredTool;

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
    /// One frame of the camera, as JPEG (`camera`).
    CaptureImage,
    /// Declared by the driver (`exec:`), run by it.
    Driver,
}

impl ToolKind {
    /// Tools that make the robot move: refused while the e-stop is latched,
    /// one at a time.
    pub fn moves(self) -> bool {
        matches!(self, ToolKind::Drive | ToolKind::NavigateTo)
    }

    /// Tools a viewer may call: reading only.
    pub fn viewer_may_call(self) -> bool {
        matches!(self, ToolKind::ListLocations | ToolKind::CaptureImage)
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
    pub name: String,
    pub kind: ToolKind,
    pub description: String,
    pub parameters: Value,
    pub level: Level,
    pub reversible: bool,
    pub safety_note: String,
    pub estimated_duration: Option<f64>,
    pub requires_confirmation: bool,
}

impl Tool {
    /// A driver's tool. `critical` always asks first; the config may turn
    /// confirmation on for others, never off for a critical one.
    pub fn declared(d: &DeclaredTool, confirm: &HashMap<String, bool>) -> Tool {
        let level = match d.level.as_str() {
            "normal" => Level::Normal,
            "critical" => Level::Critical,
            _ => Level::Elevated,
        };
        let configured = confirm.get(&d.name).copied().unwrap_or(false);
        Tool {
            name: d.name.clone(),
            kind: ToolKind::Driver,
            description: d.description.clone(),
            parameters: d.parameters.clone(),
            level,
            reversible: d.reversible,
            safety_note: d.safety_description.clone(),
            estimated_duration: None,
            requires_confirmation: level == Level::Critical
                || d.requires_confirmation
                || configured,
        }
    }

    /// Whether the call may move the robot: one at a time, refused while
    /// the e-stop is latched. A driver's tool above `normal` counts.
    pub fn moves(&self) -> bool {
        self.kind.moves() || (self.kind == ToolKind::Driver && self.level != Level::Normal)
    }

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
    motion_tools()
        .into_iter()
        .chain(other_tools())
        .map(|mut tool| {
            if let Some(on) = confirm.get(&tool.name) {
                tool.requires_confirmation = *on;
            }
            tool
        })
        .collect()
}

/// The tools that move the base or stop it.
fn motion_tools() -> Vec<Tool> {
    vec![
        Tool {
            name: "drive".into(),
            kind: ToolKind::Drive,
            description: "Drive the base at a constant velocity for a while, then stop. \
                          Progress is reported every 10 %."
                .into(),
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
            safety_note: "Moves the base; velocity limits, the workspace and the e-stop apply"
                .into(),
            estimated_duration: None,
            requires_confirmation: false,
        },
        Tool {
            name: "stop".into(),
            kind: ToolKind::Stop,
            description: "Stop the base now; a running drive ends as cancelled.".into(),
            parameters: no_arguments(),
            level: Level::Normal,
            reversible: true,
            safety_note: "Stops motion".into(),
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
        Tool {
            name: "navigate_to".into(),
            kind: ToolKind::NavigateTo,
            description: "Navigate to a saved location (see list_locations).".into(),
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
            safety_note: "Moves the base autonomously; the workspace and the e-stop apply".into(),
            estimated_duration: None,
            requires_confirmation: false,
        },
        Tool {
            name: "cancel_navigation".into(),
            kind: ToolKind::CancelNavigation,
            description: "Cancel the navigation in progress.".into(),
            parameters: no_arguments(),
            level: Level::Normal,
            reversible: true,
            safety_note: "Stops autonomous motion".into(),
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
    ]
}

/// Saved locations, and the e-stop's release.
fn other_tools() -> Vec<Tool> {
    vec![
        Tool {
            name: "save_location".into(),
            kind: ToolKind::SaveLocation,
            description: "Save the current pose under a name, for navigate_to.".into(),
            parameters: json!({
                "type": "object",
                "properties": { "name": { "type": "string", "minLength": 1, "maxLength": 64 } },
                "required": ["name"],
                "additionalProperties": false,
            }),
            level: Level::Normal,
            reversible: true,
            safety_note: "Stores data; does not move".into(),
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
        Tool {
            name: "list_locations".into(),
            kind: ToolKind::ListLocations,
            description: "List the saved locations.".into(),
            parameters: no_arguments(),
            level: Level::Normal,
            reversible: true,
            safety_note: "Reads data; does not move".into(),
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
        Tool {
            name: "capture_image".into(),
            kind: ToolKind::CaptureImage,
            description: "Capture one frame of the robot's camera as a JPEG image \
                          (result.image: {mimeType, width, height, data (base64)}). Without a \
                          camera (sim, test pattern) the frame is synthetic: colour bars with \
                          a marker that follows the pose. At most 5 a second."
                .into(),
            parameters: no_arguments(),
            level: Level::Normal,
            reversible: true,
            safety_note: "Reads the camera; does not move".into(),
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
        Tool {
            name: "reset_emergency_stop".into(),
            kind: ToolKind::ResetEmergencyStop,
            description: "Release a latched emergency stop (operator only). Motion is \
                          possible again afterwards."
                .into(),
            parameters: no_arguments(),
            level: Level::Elevated,
            reversible: false,
            safety_note: "Re-enables motion after an emergency stop".into(),
            estimated_duration: Some(0.0),
            requires_confirmation: false,
        },
    ]
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
    /// A driver tool's arguments, checked against its schema.
    Driver(Value),
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
pub fn parse_args(tool: &Tool, arguments: &Value) -> Result<Args, ArpError> {
    Ok(match tool.kind {
        ToolKind::Driver => {
            let validator = jsonschema::validator_for(&tool.parameters).map_err(|e| {
                tracing::warn!(tool = %tool.name, error = %e, "driver tool schema does not compile");
                ArpError::Precondition(format!("the driver's schema of {} is broken", tool.name))
            })?;
            if let Some(e) = validator.iter_errors(arguments).next() {
                let path = e.instance_path.to_string();
                let field = format!("arguments{}", path.replace('/', "."));
                return Err(ArpError::InvalidParams {
                    message: format!("{field}: {e}"),
                    field: Some(field),
                });
            }
            Args::Driver(arguments.clone())
        }
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
        | ToolKind::CaptureImage
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
        let tools = catalogue(&HashMap::new());
        let drive = tools.iter().find(|t| t.name == "drive").expect("drive");
        let stop = tools.iter().find(|t| t.name == "stop").expect("stop");
        assert!(parse_args(
            drive,
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
            match parse_args(drive, &bad) {
                Err(ArpError::InvalidParams { field: Some(f), .. }) => assert_eq!(f, field),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(parse_args(stop, &json!({"x": 1})).is_err());
    }

    #[test]
    fn declared_tools_are_checked_and_critical_ones_always_confirm() {
        let declared = DeclaredTool {
            name: "dock".into(),
            description: "Dock".into(),
            parameters: json!({"type": "object", "properties": {"speed": {"type": "number"}}, "additionalProperties": false}),
            level: "critical".into(),
            requires_confirmation: false,
            reversible: true,
            safety_description: String::new(),
        };
        let off = HashMap::from([("dock".to_owned(), false)]);
        let tool = Tool::declared(&declared, &off);
        assert!(tool.requires_confirmation && tool.moves());
        assert!(parse_args(&tool, &json!({"speed": 0.1})).is_ok());
        match parse_args(&tool, &json!({"speed": "fast"})) {
            Err(ArpError::InvalidParams { field: Some(f), .. }) => assert_eq!(f, "arguments.speed"),
            other => panic!("{other:?}"),
        }
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
