//! ARP settings: `[arp]` in agent.toml, `--arp-listen`, `--arp-token`.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
pub use signalling_protocol::arp::ConfirmationPolicy;

use crate::safety::Role;

/// Seconds a client has to answer `arp.requestConfirmation` by default.
pub const DEFAULT_CONFIRMATION_TIMEOUT_SECS: f64 = 30.0;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArpConfigError {
    #[error("invalid ARP token {0:?}: expected ROLE:SECRET with ROLE viewer, operator or owner")]
    Token(String),
    #[error("invalid --arp-listen address {0:?}")]
    Listen(String),
    #[error("refusing to serve ARP on non-loopback {0} without an --arp-token")]
    NoTokenOnNetwork(std::net::SocketAddr),
    #[error("invalid [arp] workspace: {0}")]
    Workspace(String),
    #[error("invalid [arp] confirmation_timeout_secs: {0}")]
    Timeout(f64),
}

/// `[arp]` in agent.toml.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ArpFileConfig {
    /// Address of the local ARP WebSocket (off when unset).
    pub listen: Option<String>,
    /// `ROLE:SECRET` credentials of the local WebSocket.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// What a `drive` over the velocity limit gets: refused or clamped.
    pub velocity_violation: Option<ViolationAction>,
    /// Which tools ask a person first, and who may answer.
    #[serde(default)]
    pub confirm: ConfirmConfig,
    pub confirmation_timeout_secs: Option<f64>,
    /// A box the robot must stay in (odom frame).
    pub workspace: Option<WorkspaceConfig>,
    pub robot_model: Option<String>,
    pub robot_type: Option<String>,
    /// `nav_msgs/Odometry` topic of the rosbridge driver (default `/odom`).
    pub odometry_topic: Option<String>,
}

/// `[arp.confirm]`: `policy = "console" | "client"` and `TOOL = true | false`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ConfirmConfig {
    /// Who answers through the gateway (docs/arp.md, "Who confirms"); `console` if unset.
    #[serde(default)]
    pub policy: ConfirmationPolicy,
    /// Tool name → whether it asks the caller's human first.
    #[serde(flatten)]
    pub tools: HashMap<String, bool>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ViolationAction {
    #[default]
    Reject,
    Clamp,
}

impl ViolationAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationAction::Reject => "reject",
            ViolationAction::Clamp => "clamp",
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceConfig {
    #[serde(default = "default_workspace_name")]
    pub name: String,
    pub min: Vec<f64>,
    pub max: Vec<f64>,
}

fn default_workspace_name() -> String {
    "workspace".into()
}

/// A box in the odometry frame. A mobile base checks x and y; a third
/// coordinate, when given, is kept for listing only (the base is at z = 0).
#[derive(Debug, Clone, PartialEq)]
pub struct Workspace {
    pub name: String,
    pub min: Vec<f64>,
    pub max: Vec<f64>,
}

impl Workspace {
    pub fn new(name: String, min: Vec<f64>, max: Vec<f64>) -> Result<Workspace, ArpConfigError> {
        let ok_len = |v: &[f64]| (2..=3).contains(&v.len());
        if !ok_len(&min) || min.len() != max.len() {
            return Err(ArpConfigError::Workspace(
                "min and max need 2 or 3 coordinates each".into(),
            ));
        }
        if min.iter().chain(&max).any(|v| !v.is_finite())
            || min.iter().zip(&max).any(|(a, b)| a > b)
        {
            return Err(ArpConfigError::Workspace(
                "coordinates must be finite with min <= max".into(),
            ));
        }
        Ok(Workspace { name, min, max })
    }

    pub fn contains(&self, x: f64, y: f64) -> bool {
        x >= self.min[0] && x <= self.max[0] && y >= self.min[1] && y <= self.max[1]
    }

    /// Whether `inner` lies within this box (x and y).
    pub fn encloses(&self, inner: &Workspace) -> bool {
        self.contains(inner.min[0], inner.min[1]) && self.contains(inner.max[0], inner.max[1])
    }

    pub fn parameters(&self) -> Value {
        json!({ "type": "box", "min": self.min, "max": self.max, "frame": "odom" })
    }
}

/// One credential of the local WebSocket.
#[derive(Clone, PartialEq)]
pub struct Token {
    pub role: Role,
    pub secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never log the secret.
        write!(f, "Token({}:***)", self.role)
    }
}

impl FromStr for Token {
    type Err = ArpConfigError;

    fn from_str(text: &str) -> Result<Token, ArpConfigError> {
        // The error names the role part only: a token must not reach a log.
        let invalid = || {
            ArpConfigError::Token(match text.split_once(':') {
                Some((role, _)) => role.to_owned(),
                None => "(no ROLE: prefix)".to_owned(),
            })
        };
        let (role, secret) = text.split_once(':').ok_or_else(invalid)?;
        let role = Role::parse(role.trim()).ok_or_else(invalid)?;
        if secret.is_empty() || secret.chars().any(char::is_whitespace) {
            return Err(invalid());
        }
        Ok(Token {
            role,
            secret: secret.to_owned(),
        })
    }
}

/// Everything the ARP server needs besides the shared agent state.
#[derive(Debug, Clone)]
pub struct ArpOptions {
    pub velocity_violation: ViolationAction,
    /// Tools whose `requiresConfirmation` differs from the default.
    pub confirm: HashMap<String, bool>,
    /// Who may answer a confirmation through the gateway; told to the server with each
    /// request (`meta.confirmationPolicy`).
    pub confirmation_policy: ConfirmationPolicy,
    pub confirmation_timeout: Duration,
    pub workspace: Option<Workspace>,
    pub robot_model: Option<String>,
    pub robot_type: Option<String>,
    /// Whether the driver reports its pose (the `odometry` context).
    pub odometry: bool,
    /// Tools the driver declares (`exec:`), listed after the built-ins.
    pub driver_tools: Option<tokio::sync::watch::Receiver<Vec<crate::driver::DeclaredTool>>>,
    /// The robot's cameras: `capture_image` shows the first one's picture (none: the
    /// synthetic frame).
    pub cameras: Vec<std::sync::Arc<crate::video::Camera>>,
}

impl Default for ArpOptions {
    fn default() -> Self {
        ArpOptions {
            velocity_violation: ViolationAction::Reject,
            confirm: HashMap::new(),
            confirmation_policy: ConfirmationPolicy::Console,
            confirmation_timeout: Duration::from_secs_f64(DEFAULT_CONFIRMATION_TIMEOUT_SECS),
            workspace: None,
            robot_model: None,
            robot_type: None,
            odometry: true,
            driver_tools: None,
            cameras: Vec::new(),
        }
    }
}

impl ArpOptions {
    pub fn from_file(file: &ArpFileConfig, odometry: bool) -> Result<ArpOptions, ArpConfigError> {
        let timeout = file
            .confirmation_timeout_secs
            .unwrap_or(DEFAULT_CONFIRMATION_TIMEOUT_SECS);
        if !(timeout.is_finite() && timeout > 0.0 && timeout <= 3600.0) {
            return Err(ArpConfigError::Timeout(timeout));
        }
        let workspace = file
            .workspace
            .clone()
            .map(|w| Workspace::new(w.name, w.min, w.max))
            .transpose()?;
        Ok(ArpOptions {
            velocity_violation: file.velocity_violation.unwrap_or_default(),
            confirm: file.confirm.tools.clone(),
            confirmation_policy: file.confirm.policy,
            confirmation_timeout: Duration::from_secs_f64(timeout),
            workspace,
            robot_model: file.robot_model.clone(),
            robot_type: file.robot_type.clone(),
            odometry,
            driver_tools: None,
            cameras: Vec::new(),
        })
    }
}

/// Where and for whom the local WebSocket listens.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    pub addr: std::net::SocketAddr,
    pub tokens: Vec<Token>,
}

impl ListenConfig {
    /// Checks the rule: a non-loopback address needs at least one token.
    pub fn new(addr: &str, tokens: Vec<Token>) -> Result<ListenConfig, ArpConfigError> {
        let addr: std::net::SocketAddr = addr
            .parse()
            .map_err(|_| ArpConfigError::Listen(addr.to_owned()))?;
        if !addr.ip().is_loopback() && tokens.is_empty() {
            return Err(ArpConfigError::NoTokenOnNetwork(addr));
        }
        Ok(ListenConfig { addr, tokens })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_and_hide_their_secret() {
        let t: Token = "operator:s3cret".parse().expect("token");
        assert_eq!(t.role, Role::Operator);
        assert_eq!(format!("{t:?}"), "Token(operator:***)");
        for bad in ["admin:x", "operator:", "operator", ":x", "viewer:a b"] {
            assert!(bad.parse::<Token>().is_err(), "{bad}");
        }
        let shown = "just-a-secret"
            .parse::<Token>()
            .expect_err("no role")
            .to_string();
        assert!(!shown.contains("just-a-secret"), "{shown}");
    }

    #[test]
    fn non_loopback_needs_a_token() {
        assert!(ListenConfig::new("127.0.0.1:7700", vec![]).is_ok());
        assert!(ListenConfig::new("[::1]:7700", vec![]).is_ok());
        assert!(matches!(
            ListenConfig::new("0.0.0.0:7700", vec![]),
            Err(ArpConfigError::NoTokenOnNetwork(_))
        ));
        let t: Token = "viewer:v".parse().expect("token");
        assert!(ListenConfig::new("0.0.0.0:7700", vec![t]).is_ok());
        assert!(ListenConfig::new("nowhere", vec![]).is_err());
    }

    #[test]
    fn the_confirmation_policy_sits_beside_the_tools_and_defaults_to_the_console() {
        let parse = |text: &str| toml::from_str::<ArpFileConfig>(text);
        let file = parse("[confirm]\ndrive = true\n").expect("parses");
        assert_eq!(file.confirm.policy, ConfirmationPolicy::Console);
        assert_eq!(file.confirm.tools.get("drive"), Some(&true));
        let file = parse("[confirm]\npolicy = \"client\"\ndrive = true\n").expect("parses");
        let options = ArpOptions::from_file(&file, true).expect("options");
        assert_eq!(options.confirmation_policy, ConfirmationPolicy::Client);
        assert_eq!(options.confirm.get("drive"), Some(&true));
        assert!(!options.confirm.contains_key("policy"));
        assert!(parse("[confirm]\npolicy = \"anyone\"\n").is_err());
    }

    #[test]
    fn workspace_checks() {
        assert!(Workspace::new("w".into(), vec![0.0], vec![1.0]).is_err());
        assert!(Workspace::new("w".into(), vec![1.0, 0.0], vec![0.0, 1.0]).is_err());
        let w = Workspace::new("w".into(), vec![-1.0, -1.0], vec![1.0, 1.0]).expect("box");
        assert!(w.contains(0.5, -0.5) && !w.contains(1.5, 0.0));
        let inner = Workspace::new("i".into(), vec![-0.5, -0.5], vec![0.5, 0.5]).expect("box");
        assert!(w.encloses(&inner) && !inner.encloses(&w));
    }
}
