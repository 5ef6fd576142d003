//! User-settable configuration of `agent.config.get` / `agent.config.update`.
//!
//! The keys are those of the spec's `config/supported.keys.json` (video and
//! ROS topic settings, which take effect at the next start) plus the agent's
//! own `safety.*` keys, which apply at once. Values are validated per key,
//! kept in a JSON file written atomically, and survive restarts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::fsutil;
use crate::safety::SafetyLimits;

/// Key of the operator-side reset of a latched emergency stop. It is an
/// action, not a setting: it is neither stored nor listed by `config.get`.
pub const ESTOP_RESET_KEY: &str = "safety.estop_reset";

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("unknown configuration key {0:?}")]
    UnknownKey(String),
    #[error("invalid value for {key}: {reason}")]
    InvalidValue { key: String, reason: String },
    #[error("cannot store settings in {path}: {source}")]
    Storage {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How a key's value is checked.
#[derive(Debug, Clone, Copy)]
enum Rule {
    OneOf(&'static [&'static str]),
    Resolution,
    RosTopic,
    /// A number within `(min, max]`.
    Number {
        min_exclusive: f64,
        max: f64,
    },
    /// An integer within `[min, max]`.
    Integer {
        min: u64,
        max: u64,
    },
}

struct KeySpec {
    key: &'static str,
    rule: Rule,
    default: DefaultValue,
    restart_required: bool,
}

enum DefaultValue {
    Str(&'static str),
    Num(f64),
    Int(u64),
}

impl DefaultValue {
    fn to_value(&self) -> Value {
        match self {
            DefaultValue::Str(s) => Value::String((*s).to_owned()),
            DefaultValue::Num(n) => serde_json::Number::from_f64(*n)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            DefaultValue::Int(i) => Value::from(*i),
        }
    }
}

const KEYS: &[KeySpec] = &[
    KeySpec {
        key: "image_format",
        rule: Rule::OneOf(&["Jpeg", "Raw"]),
        default: DefaultValue::Str("Jpeg"),
        restart_required: true,
    },
    KeySpec {
        key: "resolution",
        rule: Rule::Resolution,
        default: DefaultValue::Str("640x480"),
        restart_required: true,
    },
    KeySpec {
        key: "video_source",
        rule: Rule::OneOf(&["Ros", "Zenoh"]),
        default: DefaultValue::Str("Ros"),
        restart_required: true,
    },
    KeySpec {
        key: "image_encoding",
        rule: Rule::OneOf(&["BGR", "RGB", "MONO8"]),
        default: DefaultValue::Str("RGB"),
        restart_required: true,
    },
    KeySpec {
        key: "ros.camera_raw_topic",
        rule: Rule::RosTopic,
        default: DefaultValue::Str("/camera/image_raw"),
        restart_required: true,
    },
    KeySpec {
        key: "ros.camera_jpeg_topic",
        rule: Rule::RosTopic,
        default: DefaultValue::Str("/camera/image_raw/compressed"),
        restart_required: true,
    },
    KeySpec {
        key: "ros.nav_status_topic",
        rule: Rule::RosTopic,
        default: DefaultValue::Str("/modulr/nav/status"),
        restart_required: true,
    },
    KeySpec {
        key: "ros.cmd_vel_topic",
        rule: Rule::RosTopic,
        default: DefaultValue::Str("/cmd_vel"),
        restart_required: true,
    },
    KeySpec {
        key: "ros.nav_goal_topic",
        rule: Rule::RosTopic,
        default: DefaultValue::Str("/modulr/nav/goal"),
        restart_required: true,
    },
    KeySpec {
        key: "ros.nav_cancel_topic",
        rule: Rule::RosTopic,
        default: DefaultValue::Str("/modulr/nav/cancel"),
        restart_required: true,
    },
    KeySpec {
        key: "ros.nav_home_topic",
        rule: Rule::RosTopic,
        default: DefaultValue::Str("/modulr/nav/home"),
        restart_required: true,
    },
    KeySpec {
        key: "safety.max_linear_speed",
        rule: Rule::Number {
            min_exclusive: 0.0,
            max: 10.0,
        },
        default: DefaultValue::Num(0.5),
        restart_required: false,
    },
    KeySpec {
        key: "safety.max_angular_speed",
        rule: Rule::Number {
            min_exclusive: 0.0,
            max: 20.0,
        },
        default: DefaultValue::Num(1.0),
        restart_required: false,
    },
    KeySpec {
        key: "safety.watchdog_ms",
        rule: Rule::Integer { min: 50, max: 5000 },
        default: DefaultValue::Int(300),
        restart_required: false,
    },
    KeySpec {
        key: "safety.max_command_rate",
        rule: Rule::Integer { min: 1, max: 1000 },
        default: DefaultValue::Int(50),
        restart_required: false,
    },
];

/// Outcome of a successful update, for `agent.config.response`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub restart_required: bool,
}

/// Current settings, backed by a JSON file (or memory only, in tests).
#[derive(Debug)]
pub struct Settings {
    path: Option<PathBuf>,
    values: BTreeMap<String, Value>,
}

impl Settings {
    /// Defaults, with the safety values of the agent's config file.
    pub fn defaults(safety: &SafetyLimits) -> Settings {
        let mut values = BTreeMap::new();
        for spec in KEYS {
            values.insert(spec.key.to_owned(), spec.default.to_value());
        }
        let mut settings = Settings { path: None, values };
        settings.put_safety(safety);
        settings
    }

    /// Loads `path` over the defaults. Stored values that are no longer
    /// valid (an older agent, a hand edit) are dropped with a warning rather
    /// than refusing to start the robot.
    pub fn load(path: &Path, safety: &SafetyLimits) -> Result<Settings, SettingsError> {
        let mut settings = Settings::defaults(safety);
        settings.path = Some(path.to_owned());
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(settings),
            Err(source) => {
                return Err(SettingsError::Storage {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        let stored: Map<String, Value> = match serde_json::from_str(&text) {
            Ok(map) => map,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "settings file is not a JSON object; using defaults");
                return Ok(settings);
            }
        };
        for (key, value) in stored {
            match validate(&key, &value) {
                Ok(_) => {
                    settings.values.insert(key, value);
                }
                Err(e) => tracing::warn!(error = %e, "ignoring stored setting"),
            }
        }
        Ok(settings)
    }

    /// Every user-settable key with its current value (`config.get`).
    pub fn snapshot(&self) -> Map<String, Value> {
        self.values
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    /// A string setting, e.g. a ROS topic.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.values.get(key).and_then(Value::as_str)
    }

    /// Validates and stores one key. The file is written before the change
    /// is reported as applied; on a storage failure the old value stays.
    pub fn update(&mut self, key: &str, value: Value) -> Result<Applied, SettingsError> {
        let spec = validate(key, &value)?;
        let previous = self.values.insert(key.to_owned(), value);
        if let Err(e) = self.persist() {
            match previous {
                Some(old) => self.values.insert(key.to_owned(), old),
                None => self.values.remove(key),
            };
            return Err(e);
        }
        Ok(Applied {
            restart_required: spec.restart_required,
        })
    }

    /// The safety limits the current settings describe.
    pub fn safety_limits(&self, base: &SafetyLimits) -> SafetyLimits {
        let num = |key: &str| self.values.get(key).and_then(Value::as_f64);
        let mut limits = base.clone();
        if let Some(v) = num("safety.max_linear_speed") {
            limits.max_linear = v;
        }
        if let Some(v) = num("safety.max_angular_speed") {
            limits.max_angular = v;
        }
        if let Some(v) = self
            .values
            .get("safety.watchdog_ms")
            .and_then(Value::as_u64)
        {
            limits.watchdog = std::time::Duration::from_millis(v);
        }
        if let Some(v) = self
            .values
            .get("safety.max_command_rate")
            .and_then(Value::as_u64)
        {
            limits.max_command_rate = u32::try_from(v).unwrap_or(u32::MAX);
        }
        limits
    }

    fn put_safety(&mut self, safety: &SafetyLimits) {
        let number = |v: f64| {
            serde_json::Number::from_f64(v)
                .map(Value::Number)
                .unwrap_or(Value::Null)
        };
        self.values
            .insert("safety.max_linear_speed".into(), number(safety.max_linear));
        self.values.insert(
            "safety.max_angular_speed".into(),
            number(safety.max_angular),
        );
        self.values.insert(
            "safety.watchdog_ms".into(),
            Value::from(u64::try_from(safety.watchdog.as_millis()).unwrap_or(u64::MAX)),
        );
        self.values.insert(
            "safety.max_command_rate".into(),
            Value::from(safety.max_command_rate),
        );
    }

    fn persist(&self) -> Result<(), SettingsError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let text = serde_json::to_string_pretty(&self.snapshot()).unwrap_or_default();
        fsutil::write_atomic(path, text.as_bytes()).map_err(|source| SettingsError::Storage {
            path: path.clone(),
            source,
        })
    }
}

fn validate(key: &str, value: &Value) -> Result<&'static KeySpec, SettingsError> {
    let spec = KEYS
        .iter()
        .find(|s| s.key == key)
        .ok_or_else(|| SettingsError::UnknownKey(key.to_owned()))?;
    let invalid = |reason: String| SettingsError::InvalidValue {
        key: key.to_owned(),
        reason,
    };
    match spec.rule {
        Rule::OneOf(allowed) => {
            let s = value
                .as_str()
                .ok_or_else(|| invalid("must be a string".into()))?;
            if !allowed.contains(&s) {
                return Err(invalid(format!("must be one of {allowed:?}")));
            }
        }
        Rule::Resolution => {
            let s = value
                .as_str()
                .ok_or_else(|| invalid("must be a string".into()))?;
            check_resolution(s).map_err(invalid)?;
        }
        Rule::RosTopic => {
            let s = value
                .as_str()
                .ok_or_else(|| invalid("must be a string".into()))?;
            check_ros_topic(s).map_err(invalid)?;
        }
        Rule::Number { min_exclusive, max } => {
            let n = value
                .as_f64()
                .ok_or_else(|| invalid("must be a number".into()))?;
            if !(n.is_finite() && n > min_exclusive && n <= max) {
                return Err(invalid(format!("must be > {min_exclusive} and <= {max}")));
            }
        }
        Rule::Integer { min, max } => {
            let n = value
                .as_u64()
                .ok_or_else(|| invalid("must be a non-negative integer".into()))?;
            if !(min..=max).contains(&n) {
                return Err(invalid(format!("must be within [{min}, {max}]")));
            }
        }
    }
    Ok(spec)
}

/// `WIDTHxHEIGHT`, both positive and at most 16384 (a sanity bound).
fn check_resolution(s: &str) -> Result<(), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| "must be WIDTHxHEIGHT, e.g. 1280x720".to_string())?;
    let dims = [w, h];
    for d in dims {
        if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
            return Err("must be WIDTHxHEIGHT, e.g. 1280x720".into());
        }
        match d.parse::<u32>() {
            Ok(n) if (1..=16384).contains(&n) => {}
            _ => return Err("width and height must be within 1..16384".into()),
        }
    }
    Ok(())
}

/// The ROS name rules of `supported.keys.json`.
pub fn check_ros_topic(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 256 {
        return Err("must be 1-256 characters".into());
    }
    let body = s.strip_prefix(['~', '/']).unwrap_or(s);
    if body.is_empty() {
        return Err("must name a topic".into());
    }
    if !body
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '{' | '}' | '~'))
    {
        return Err("allowed characters are [a-zA-Z0-9_/{}~]".into());
    }
    if s.ends_with('/') {
        return Err("must not end with a slash".into());
    }
    if s.contains("//") {
        return Err("must not contain //".into());
    }
    if s.contains("__") {
        return Err("must not contain __".into());
    }
    if s.split('/')
        .any(|segment| segment.starts_with(|c: char| c.is_ascii_digit()))
    {
        return Err("no path segment may start with a digit".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> SafetyLimits {
        SafetyLimits::default()
    }

    #[test]
    fn defaults_cover_every_spec_key() {
        let s = Settings::defaults(&limits());
        let snap = s.snapshot();
        for key in [
            "image_format",
            "resolution",
            "video_source",
            "image_encoding",
            "ros.camera_raw_topic",
            "ros.camera_jpeg_topic",
            "ros.nav_status_topic",
            "ros.cmd_vel_topic",
            "ros.nav_goal_topic",
            "ros.nav_cancel_topic",
            "ros.nav_home_topic",
        ] {
            assert!(snap.contains_key(key), "{key}");
        }
        assert!(!snap.contains_key(ESTOP_RESET_KEY));
        assert_eq!(snap["safety.watchdog_ms"], json!(300));
    }

    #[test]
    fn values_are_validated_per_key() {
        let mut s = Settings::defaults(&limits());
        assert!(s.update("image_format", json!("Raw")).is_ok());
        assert!(matches!(
            s.update("image_format", json!("Png")),
            Err(SettingsError::InvalidValue { .. })
        ));
        assert!(matches!(
            s.update("image_format", json!(3)),
            Err(SettingsError::InvalidValue { .. })
        ));
        assert!(s.update("resolution", json!("1280x720")).is_ok());
        for bad in ["1280", "x720", "0x720", "12a0x720", "99999x1"] {
            assert!(s.update("resolution", json!(bad)).is_err(), "{bad}");
        }
        assert!(matches!(
            s.update("no.such.key", json!(1)),
            Err(SettingsError::UnknownKey(_))
        ));
        assert!(s.update("safety.max_linear_speed", json!(0.0)).is_err());
        assert!(s.update("safety.max_linear_speed", json!(1.2)).is_ok());
        assert!(s.update("safety.watchdog_ms", json!(10)).is_err());
        assert!(s.update("safety.watchdog_ms", json!(250.5)).is_err());
        let applied = s.update("safety.watchdog_ms", json!(200)).expect("valid");
        assert!(!applied.restart_required);
        let limits = s.safety_limits(&limits());
        assert_eq!(limits.max_linear, 1.2);
        assert_eq!(limits.watchdog.as_millis(), 200);
    }

    #[test]
    fn ros_topic_rules() {
        for good in [
            "/cmd_vel",
            "cmd_vel",
            "~/private",
            "/robot1/cmd_vel",
            "/a/{ns}/b",
        ] {
            assert!(check_ros_topic(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/",
            "/cmd vel",
            "/cmd_vel/",
            "//cmd",
            "/a__b",
            "/1robot",
            "/a/2b",
            "/ü",
        ] {
            assert!(check_ros_topic(bad).is_err(), "{bad}");
        }
        assert!(check_ros_topic(&format!("/{}", "a".repeat(256))).is_err());
    }

    #[test]
    fn updates_survive_a_restart() {
        let dir = crate::testutil::temp_dir("settings");
        let path = dir.join("settings.json");
        let mut s = Settings::load(&path, &limits()).expect("load");
        s.update("ros.cmd_vel_topic", json!("/base/cmd_vel"))
            .expect("update");
        let again = Settings::load(&path, &limits()).expect("reload");
        assert_eq!(again.get_str("ros.cmd_vel_topic"), Some("/base/cmd_vel"));
    }

    #[test]
    fn invalid_stored_values_fall_back_to_defaults() {
        let dir = crate::testutil::temp_dir("settings-bad");
        let path = dir.join("settings.json");
        std::fs::write(&path, r#"{"image_format":"Gif","resolution":"800x600"}"#).expect("write");
        let s = Settings::load(&path, &limits()).expect("load");
        assert_eq!(s.get_str("image_format"), Some("Jpeg"));
        assert_eq!(s.get_str("resolution"), Some("800x600"));
    }
}
