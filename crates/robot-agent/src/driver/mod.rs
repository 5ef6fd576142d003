//! Drivers: what turns safe, physical velocity commands into robot motion.
//!
//! A driver runs as its own task and talks to the controller through two
//! bounded channels: [`DriverCommand`]s in, [`DriverEvent`]s out. The safety
//! layer sits in front of every driver, so a driver only ever sees commands
//! that already passed the role, limit, watchdog and e-stop checks.

use std::str::FromStr;
use std::time::Duration;

use signalling_protocol::{NavigationStatus, Orientation, Position};
use tokio::sync::{mpsc, oneshot, watch};

use crate::safety::StopReason;

pub mod exec;
pub mod lines;
pub mod rosbridge;
pub mod serial;
pub mod sim;

/// Capacity of the command and event channels. Small on purpose: a stalled
/// driver must make the controller refuse commands, not queue stale ones.
pub const CHANNEL_CAPACITY: usize = 32;

/// How long a driver may take to accept or refuse a navigation request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("invalid driver spec {0:?}: expected sim, exec:COMMAND, rosbridge:WS_URL or serial:DEVICE[@BAUD]")]
    InvalidSpec(String),
    #[error("driver is not available")]
    Unavailable,
    #[error("driver did not answer in time")]
    Timeout,
    #[error("driver refused: {message} (code {code})")]
    Refused { code: i64, message: String },
    #[error("driver does not support {0}")]
    Unsupported(&'static str),
    #[error("driver I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("serial port: {0}")]
    Serial(#[from] serialport::Error),
    #[error("rosbridge: {0}")]
    WebSocket(String),
}

/// Result of a driver request, sent back on a oneshot.
pub type Reply = oneshot::Sender<Result<(), DriverError>>;

/// Result of a driver-declared tool call: whatever the driver answered.
pub type ToolReply = oneshot::Sender<Result<serde_json::Value, DriverError>>;

/// How long a driver-declared tool may run before the call fails.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(300);

/// A tool an `exec:` driver declares in its `ready` notification
/// (`params.tools`), offered over ARP next to the built-in ones.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredTool {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: serde_json::Value,
    /// `normal`, `elevated` or `critical`.
    pub level: String,
    pub requires_confirmation: bool,
    pub reversible: bool,
    pub safety_description: String,
}

/// What the controller asks of the driver.
#[derive(Debug)]
pub enum DriverCommand {
    /// Drive at this velocity (m/s, rad/s) until told otherwise.
    Move { linear: f64, angular: f64 },
    /// Stop all motion, including any navigation.
    Stop { reason: StopReason },
    /// Drive to a saved location; `reply` says whether the driver accepted.
    Navigate {
        name: String,
        position: Position,
        orientation: Option<Orientation>,
        reply: Reply,
    },
    /// Abort the current navigation.
    CancelNavigation { reply: Reply },
    /// Run a tool the driver declared (`exec:` drivers only).
    CallTool {
        name: String,
        arguments: serde_json::Value,
        reply: ToolReply,
    },
}

/// What the driver reports.
#[derive(Debug, Clone, PartialEq)]
pub enum DriverEvent {
    /// Ready for commands (at start, and again after a restart/reconnect).
    Ready,
    /// Lost (crashed child, closed port, dropped socket); the controller holds
    /// the robot stopped and refuses motion until `Ready` again.
    Unavailable { reason: String },
    /// Progress of the current navigation.
    Navigation {
        name: String,
        status: NavigationStatus,
        message: Option<String>,
    },
    /// Hardware or driver-side emergency stop; the controller latches it.
    EmergencyStop { reason: String },
}

/// Where the robot is, in the driver's odometry frame (`odom`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Pose {
    pub x: f64,
    pub y: f64,
    /// Heading, radians, counter-clockwise from +x.
    pub theta: f64,
}

/// The controller's end of a running driver.
pub struct DriverHandle {
    pub commands: mpsc::Sender<DriverCommand>,
    pub events: mpsc::Receiver<DriverEvent>,
    /// The latest pose, for drivers that know it (`None` until then). A
    /// watch, not the event channel: readers want the newest value only.
    pub pose: watch::Receiver<Option<Pose>>,
    /// Tools the driver declared (empty for most drivers).
    pub tools: watch::Receiver<Vec<DeclaredTool>>,
}

impl DriverHandle {
    /// The two channel pairs: the controller's handle and the driver's end.
    pub fn channel() -> (DriverHandle, DriverEnd) {
        let (cmd_tx, cmd_rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (ev_tx, ev_rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (pose_tx, pose_rx) = watch::channel(None);
        let (tools_tx, tools_rx) = watch::channel(Vec::new());
        (
            DriverHandle {
                commands: cmd_tx,
                events: ev_rx,
                pose: pose_rx,
                tools: tools_rx,
            },
            DriverEnd {
                commands: cmd_rx,
                events: ev_tx,
                pose: pose_tx,
                tools: tools_tx,
            },
        )
    }
}

/// The driver task's end of the channels.
pub struct DriverEnd {
    pub commands: mpsc::Receiver<DriverCommand>,
    pub events: mpsc::Sender<DriverEvent>,
    pub pose: watch::Sender<Option<Pose>>,
    pub tools: watch::Sender<Vec<DeclaredTool>>,
}

/// Which driver to run, from `--driver`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverSpec {
    Sim,
    Exec(String),
    Rosbridge(String),
    Serial { device: String, baud: u32 },
}

/// Default baud rate of `serial:DEVICE`.
pub const DEFAULT_BAUD: u32 = 115_200;

impl FromStr for DriverSpec {
    type Err = DriverError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let invalid = || DriverError::InvalidSpec(spec.to_owned());
        if spec == "sim" {
            return Ok(DriverSpec::Sim);
        }
        let (kind, arg) = spec.split_once(':').ok_or_else(invalid)?;
        if arg.trim().is_empty() {
            return Err(invalid());
        }
        match kind {
            "exec" => Ok(DriverSpec::Exec(arg.to_owned())),
            "rosbridge" => {
                if !(arg.starts_with("ws://") || arg.starts_with("wss://")) {
                    return Err(invalid());
                }
                Ok(DriverSpec::Rosbridge(arg.to_owned()))
            }
            "serial" => {
                let (device, baud) = match arg.rsplit_once('@') {
                    Some((device, baud)) => (device, baud.parse::<u32>().map_err(|_| invalid())?),
                    None => (arg, DEFAULT_BAUD),
                };
                if device.is_empty() || baud == 0 {
                    return Err(invalid());
                }
                Ok(DriverSpec::Serial {
                    device: device.to_owned(),
                    baud,
                })
            }
            _ => Err(invalid()),
        }
    }
}

/// Settings a driver may need (ROS topics come from the agent's settings).
#[derive(Debug, Clone)]
pub struct DriverOptions {
    pub cmd_vel_topic: String,
    pub nav_goal_topic: String,
    pub nav_cancel_topic: String,
    pub nav_status_topic: String,
    /// `nav_msgs/Odometry` topic the rosbridge driver reads the pose from.
    pub odom_topic: String,
    /// First delay before restarting a crashed child / reopening a port.
    pub restart_initial: Duration,
    /// Cap of that delay.
    pub restart_max: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            cmd_vel_topic: "/cmd_vel".into(),
            nav_goal_topic: "/modulr/nav/goal".into(),
            nav_cancel_topic: "/modulr/nav/cancel".into(),
            nav_status_topic: "/modulr/nav/status".into(),
            odom_topic: "/odom".into(),
            restart_initial: Duration::from_millis(500),
            restart_max: Duration::from_secs(10),
        }
    }
}

/// Starts the driver task for `spec`; returns the controller's handle.
pub fn start(spec: &DriverSpec, options: DriverOptions) -> DriverHandle {
    let (handle, end) = DriverHandle::channel();
    match spec {
        DriverSpec::Sim => {
            sim::spawn(end, sim::SimConfig::default());
        }
        DriverSpec::Exec(command) => {
            tokio::spawn(exec::run(command.clone(), end, options));
        }
        DriverSpec::Rosbridge(url) => {
            tokio::spawn(rosbridge::run(url.clone(), end, options));
        }
        DriverSpec::Serial { device, baud } => {
            tokio::spawn(serial::run(device.clone(), *baud, end, options));
        }
    }
    handle
}

/// Restart delay that doubles per failure up to a cap.
#[derive(Debug, Clone)]
pub(crate) struct RestartBackoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl RestartBackoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        RestartBackoff {
            initial,
            max,
            next: initial,
        }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!("sim".parse::<DriverSpec>().ok(), Some(DriverSpec::Sim));
        assert_eq!(
            "exec:python3 drive.py --port 3".parse::<DriverSpec>().ok(),
            Some(DriverSpec::Exec("python3 drive.py --port 3".into()))
        );
        assert_eq!(
            "rosbridge:ws://127.0.0.1:9090".parse::<DriverSpec>().ok(),
            Some(DriverSpec::Rosbridge("ws://127.0.0.1:9090".into()))
        );
        assert_eq!(
            "serial:/dev/ttyUSB0@57600".parse::<DriverSpec>().ok(),
            Some(DriverSpec::Serial {
                device: "/dev/ttyUSB0".into(),
                baud: 57600
            })
        );
        assert_eq!(
            "serial:/dev/ttyACM0".parse::<DriverSpec>().ok(),
            Some(DriverSpec::Serial {
                device: "/dev/ttyACM0".into(),
                baud: DEFAULT_BAUD
            })
        );
        for bad in [
            "",
            "simulator",
            "exec:",
            "rosbridge:http://x",
            "serial:/dev/x@fast",
            "tcp:1",
        ] {
            assert!(bad.parse::<DriverSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn restart_backoff_doubles_to_the_cap() {
        let mut b = RestartBackoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let delays: Vec<_> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }
}
