//! The safety rules between the data channel and the driver, as a pure state
//! machine with explicit time inputs so every rule is unit-testable.
//!
//! Whatever the driver, these hold:
//! * only operator/owner sessions may move the robot;
//! * normalised commands in `[-1, 1]` are scaled by the configured maximum
//!   speeds (and clamped, in case a caller skipped validation);
//! * a dead-man watchdog stops the robot when movement commands stop coming;
//! * commands are rate limited (token bucket);
//! * an emergency stop from the driver latches until an operator resets it;
//! * no stale command moves the robot ([`freshness`], applied per session
//!   before a command reaches this core).

use std::time::{Duration, Instant};

use serde::Deserialize;

pub mod freshness;

use freshness::FreshnessConfig;

/// Role of a session, from the server's `meta.session.role`: the protocol
/// crate's type, shared with the server that writes it.
pub use signalling_protocol::Role;

/// Configured limits; `[safety]` in the config file, `safety.*` at runtime.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyLimits {
    /// m/s at `forward = ±1`.
    #[serde(rename = "max_linear_speed")]
    pub max_linear: f64,
    /// rad/s at `turn = ±1`.
    #[serde(rename = "max_angular_speed")]
    pub max_angular: f64,
    /// Dead-man timeout while moving.
    #[serde(rename = "watchdog_ms", with = "millis")]
    pub watchdog: Duration,
    /// Sustained movement/navigation commands per second.
    pub max_command_rate: u32,
    /// How far ahead of a session's clock estimate a timestamp may be
    /// before the command counts as sent from the future (stale).
    #[serde(rename = "future_tolerance_ms", with = "millis")]
    pub future_tolerance: Duration,
    /// Span of each session's sliding minimum of clock offset + delay.
    #[serde(rename = "clock_window_ms", with = "millis")]
    pub clock_window: Duration,
}

impl SafetyLimits {
    /// The freshness rules' parameters; the window is the watchdog's, so a
    /// command is stale exactly when it is older than the dead-man allows.
    pub fn freshness(&self) -> FreshnessConfig {
        FreshnessConfig {
            window: self.watchdog,
            future_tolerance: self.future_tolerance,
            clock_window: self.clock_window,
        }
    }
}

impl Default for SafetyLimits {
    fn default() -> Self {
        SafetyLimits {
            max_linear: 0.5,
            max_angular: 1.0,
            watchdog: Duration::from_millis(300),
            max_command_rate: 50,
            future_tolerance: Duration::from_millis(500),
            clock_window: Duration::from_secs(10),
        }
    }
}

mod millis {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Why the robot was told to stop; sent to the driver as `stop {reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Watchdog,
    SessionEnded,
    PeerDisconnected,
    SignallingLost,
    EmergencyStop,
    DriverStarted,
    DriverRestarted,
    NavigationCancelled,
    /// The robot left the workspace box (ARP `workspace_bound`).
    WorkspaceBound,
    /// An ARP tool call ended (completed, cancelled, `stop`).
    CallEnded,
    /// The session's ticket ran out and the server sent no fresh one.
    TicketExpired,
    Shutdown,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Watchdog => "watchdog",
            StopReason::SessionEnded => "session_ended",
            StopReason::PeerDisconnected => "peer_disconnected",
            StopReason::SignallingLost => "signalling_lost",
            StopReason::EmergencyStop => "emergency_stop",
            StopReason::DriverStarted => "driver_started",
            StopReason::DriverRestarted => "driver_restarted",
            StopReason::NavigationCancelled => "navigation_cancelled",
            StopReason::WorkspaceBound => "workspace_bound",
            StopReason::CallEnded => "call_ended",
            StopReason::TicketExpired => "ticket_expired",
            StopReason::Shutdown => "shutdown",
        }
    }
}

/// Why a command was refused; reported as `agent.error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a {0} session may not move the robot")]
    Forbidden(&'static str),
    #[error("emergency stop is latched ({0}); an operator must reset it")]
    EmergencyStop(String),
    #[error("too many commands; the limit is {0} per second")]
    RateLimited(u32),
    #[error("the driver is not available")]
    DriverUnavailable,
    #[error("the driver cannot keep up with commands")]
    DriverBusy,
    #[error("another controller holds the robot")]
    RobotBusy,
}

impl Refusal {
    /// Stable machine-readable reason for `details.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Forbidden(_) => "forbidden",
            Refusal::EmergencyStop(_) => "emergency_stop",
            Refusal::RateLimited(_) => "rate_limited",
            Refusal::DriverUnavailable => "driver_unavailable",
            Refusal::DriverBusy => "driver_busy",
            Refusal::RobotBusy => "robot_busy",
        }
    }
}

/// A velocity command in physical units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Velocity {
    /// m/s, positive forward.
    pub linear: f64,
    /// rad/s, positive counter-clockwise (turn left).
    pub angular: f64,
}

/// Token bucket: `rate` tokens per second, bursts up to one second's worth
/// (at least 5, so a client's first few messages never trip it).
#[derive(Debug, Clone)]
struct Bucket {
    tokens: f64,
    at: Option<Instant>,
}

impl Bucket {
    fn take(&mut self, now: Instant, rate: u32) -> bool {
        let capacity = f64::from(rate.max(5));
        let tokens = match self.at {
            None => capacity,
            Some(at) => {
                let elapsed = now.saturating_duration_since(at).as_secs_f64();
                (self.tokens + elapsed * f64::from(rate)).min(capacity)
            }
        };
        self.at = Some(now);
        if tokens >= 1.0 {
            self.tokens = tokens - 1.0;
            true
        } else {
            self.tokens = tokens;
            false
        }
    }
}

/// The safety state of the robot.
#[derive(Debug, Clone)]
pub struct SafetyCore {
    limits: SafetyLimits,
    /// Whether the last command sent to the driver was a non-zero velocity.
    moving: bool,
    last_command: Option<Instant>,
    /// Session whose commands the robot last followed.
    controller: Option<String>,
    estop: Option<String>,
    bucket: Bucket,
}

impl SafetyCore {
    pub fn new(limits: SafetyLimits) -> SafetyCore {
        SafetyCore {
            limits,
            moving: false,
            last_command: None,
            controller: None,
            estop: None,
            bucket: Bucket {
                tokens: 0.0,
                at: None,
            },
        }
    }

    pub fn limits(&self) -> &SafetyLimits {
        &self.limits
    }

    pub fn set_limits(&mut self, limits: SafetyLimits) {
        self.limits = limits;
    }

    pub fn is_moving(&self) -> bool {
        self.moving
    }

    pub fn estop(&self) -> Option<&str> {
        self.estop.as_deref()
    }

    /// Role, latch and rate checks shared by every motion command.
    pub fn admit(&mut self, now: Instant, role: Role) -> Result<(), Refusal> {
        if !role.may_drive() {
            return Err(Refusal::Forbidden(role.as_str()));
        }
        if let Some(reason) = &self.estop {
            return Err(Refusal::EmergencyStop(reason.clone()));
        }
        if !self.bucket.take(now, self.limits.max_command_rate) {
            return Err(Refusal::RateLimited(self.limits.max_command_rate));
        }
        Ok(())
    }

    /// A movement command: checks, scales, and arms the watchdog.
    pub fn movement(
        &mut self,
        now: Instant,
        session: &str,
        role: Role,
        forward: f64,
        turn: f64,
    ) -> Result<Velocity, Refusal> {
        self.admit(now, role)?;
        let clamp = |v: f64| {
            if v.is_finite() {
                v.clamp(-1.0, 1.0)
            } else {
                0.0
            }
        };
        let velocity = Velocity {
            linear: clamp(forward) * self.limits.max_linear,
            angular: clamp(turn) * self.limits.max_angular,
        };
        self.moving = velocity.linear != 0.0 || velocity.angular != 0.0;
        self.last_command = Some(now);
        self.controller = Some(session.to_owned());
        Ok(velocity)
    }

    /// Called periodically: `Some` when the dead-man timeout has passed
    /// while moving, in which case the caller must stop the robot.
    pub fn watchdog(&mut self, now: Instant) -> Option<StopReason> {
        let last = self.last_command?;
        if self.moving && now.saturating_duration_since(last) >= self.limits.watchdog {
            self.moving = false;
            return Some(StopReason::Watchdog);
        }
        None
    }

    /// A session is gone: whether the robot must be stopped because of it.
    /// Only the session the robot last obeyed counts, so a viewer leaving
    /// does not yank control from the operator who is driving.
    pub fn session_ended(&mut self, session: &str) -> bool {
        let was_controller = self.controller.as_deref() == Some(session);
        if was_controller {
            self.controller = None;
            self.moving = false;
        }
        was_controller
    }

    /// Any stop sent to the driver for another reason.
    pub fn stopped(&mut self) {
        self.moving = false;
    }

    /// The driver reported an emergency stop: latch it.
    pub fn emergency_stop(&mut self, reason: &str) {
        self.moving = false;
        self.estop = Some(reason.to_owned());
    }

    /// Operator-side reset of the latch; returns whether it was latched.
    pub fn reset_estop(&mut self, role: Role) -> Result<bool, Refusal> {
        if !role.may_drive() {
            return Err(Refusal::Forbidden(role.as_str()));
        }
        Ok(self.estop.take().is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> (SafetyCore, Instant) {
        (SafetyCore::new(SafetyLimits::default()), Instant::now())
    }

    #[test]
    fn roles() {
        assert_eq!(Role::parse_or_viewer(Some("owner")), Role::Owner);
        assert_eq!(Role::parse_or_viewer(Some("operator")), Role::Operator);
        assert_eq!(Role::parse_or_viewer(Some("viewer")), Role::Viewer);
        assert_eq!(Role::parse_or_viewer(Some("admin")), Role::Viewer);
        assert_eq!(Role::parse_or_viewer(None), Role::Viewer);
    }

    #[test]
    fn commands_are_scaled_and_clamped() {
        let (mut s, t) = core();
        let v = s
            .movement(t, "a", Role::Operator, 1.0, -0.5)
            .expect("allowed");
        assert_eq!(
            v,
            Velocity {
                linear: 0.5,
                angular: -0.5
            }
        );
        let v = s
            .movement(t, "a", Role::Owner, 7.0, f64::NAN)
            .expect("allowed");
        assert_eq!(
            v,
            Velocity {
                linear: 0.5,
                angular: 0.0
            }
        );
        s.set_limits(SafetyLimits {
            max_linear: 2.0,
            max_angular: 3.0,
            ..SafetyLimits::default()
        });
        let v = s.movement(t, "a", Role::Owner, 0.25, 0.5).expect("allowed");
        assert_eq!(
            v,
            Velocity {
                linear: 0.5,
                angular: 1.5
            }
        );
    }

    #[test]
    fn viewers_may_not_move() {
        let (mut s, t) = core();
        assert_eq!(
            s.movement(t, "v", Role::Viewer, 0.1, 0.0),
            Err(Refusal::Forbidden("viewer"))
        );
        assert!(!s.is_moving());
        assert_eq!(
            s.reset_estop(Role::Viewer),
            Err(Refusal::Forbidden("viewer"))
        );
    }

    #[test]
    fn watchdog_stops_only_a_moving_robot_after_the_timeout() {
        let (mut s, t) = core();
        assert_eq!(s.watchdog(t + Duration::from_secs(5)), None);
        s.movement(t, "a", Role::Operator, 0.5, 0.0)
            .expect("allowed");
        assert_eq!(s.watchdog(t + Duration::from_millis(299)), None);
        assert_eq!(
            s.watchdog(t + Duration::from_millis(300)),
            Some(StopReason::Watchdog)
        );
        // Once stopped it does not fire again.
        assert_eq!(s.watchdog(t + Duration::from_millis(900)), None);
        // A zero command is not "moving": nothing to stop.
        s.movement(t + Duration::from_secs(1), "a", Role::Operator, 0.0, 0.0)
            .expect("allowed");
        assert_eq!(s.watchdog(t + Duration::from_secs(3)), None);
    }

    #[test]
    fn fresh_commands_keep_the_watchdog_quiet() {
        let (mut s, t) = core();
        for i in 0..20 {
            let now = t + Duration::from_millis(100 * i);
            s.movement(now, "a", Role::Operator, 0.2, 0.0)
                .expect("allowed");
            assert_eq!(s.watchdog(now + Duration::from_millis(99)), None);
        }
    }

    #[test]
    fn rate_limit_allows_a_burst_then_the_sustained_rate() {
        let (mut s, t) = core();
        s.set_limits(SafetyLimits {
            max_command_rate: 10,
            ..SafetyLimits::default()
        });
        for _ in 0..10 {
            s.movement(t, "a", Role::Operator, 0.1, 0.0).expect("burst");
        }
        assert_eq!(
            s.movement(t, "a", Role::Operator, 0.1, 0.0),
            Err(Refusal::RateLimited(10))
        );
        // 100 ms later one more token is there.
        let later = t + Duration::from_millis(100);
        s.movement(later, "a", Role::Operator, 0.1, 0.0)
            .expect("refilled");
        assert!(s.movement(later, "a", Role::Operator, 0.1, 0.0).is_err());
    }

    #[test]
    fn emergency_stop_latches_until_an_operator_resets_it() {
        let (mut s, t) = core();
        s.movement(t, "a", Role::Operator, 0.5, 0.0)
            .expect("allowed");
        s.emergency_stop("bumper");
        assert!(!s.is_moving());
        assert_eq!(
            s.movement(t, "a", Role::Operator, 0.5, 0.0),
            Err(Refusal::EmergencyStop("bumper".into()))
        );
        assert_eq!(s.reset_estop(Role::Operator), Ok(true));
        assert_eq!(s.reset_estop(Role::Operator), Ok(false));
        s.movement(t, "a", Role::Operator, 0.5, 0.0)
            .expect("allowed again");
    }

    #[test]
    fn ending_the_driving_session_stops() {
        let (mut s, t) = core();
        s.movement(t, "a", Role::Operator, 0.5, 0.0)
            .expect("allowed");
        assert!(!s.session_ended("viewer-session"));
        assert!(s.is_moving());
        assert!(s.session_ended("a"));
        assert!(!s.is_moving());
        assert!(!s.session_ended("a"));
    }
}
