//! `--driver sim`: a simulated differential-drive base.
//!
//! Integrates the unicycle model at a fixed rate; navigation turns towards
//! the goal, drives to it, then turns to the goal's yaw if one was given,
//! and reports `completed`. Useful for demos, CI and trying the webapp
//! without hardware.

use std::f64::consts::PI;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use signalling_protocol::{NavigationStatus, Orientation, Position};

use super::{DriverCommand, DriverEnd, DriverEvent};

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Integration step.
    pub step: Duration,
    /// Cruise speed while navigating (m/s).
    pub nav_linear: f64,
    /// Turn rate while navigating (rad/s).
    pub nav_angular: f64,
    /// Distance at which the goal counts as reached (m).
    pub position_tolerance: f64,
    /// Heading error at which the goal yaw counts as reached (rad).
    pub yaw_tolerance: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            step: Duration::from_millis(20),
            nav_linear: 0.5,
            nav_angular: 1.5,
            position_tolerance: 0.05,
            yaw_tolerance: 0.05,
        }
    }
}

/// Pose and commanded velocity of the simulated base.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimState {
    pub x: f64,
    pub y: f64,
    /// Heading, radians, normalised to (-π, π].
    pub theta: f64,
    pub linear: f64,
    pub angular: f64,
    /// Name of the location being navigated to.
    pub goal: Option<String>,
    /// Last stop reason received.
    pub last_stop: Option<String>,
}

/// A window into the simulation, for tests and diagnostics.
#[derive(Debug, Clone, Default)]
pub struct SimProbe(Arc<Mutex<SimState>>);

impl SimProbe {
    pub fn state(&self) -> SimState {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

struct Goal {
    name: String,
    position: Position,
    yaw: Option<f64>,
}

/// Starts the simulation task.
pub fn spawn(end: DriverEnd, config: SimConfig) -> SimProbe {
    let probe = SimProbe::default();
    tokio::spawn(run(end, config, probe.clone()));
    probe
}

async fn run(mut end: DriverEnd, config: SimConfig, probe: SimProbe) {
    let mut state = SimState::default();
    let mut goal: Option<Goal> = None;
    if end.events.send(DriverEvent::Ready).await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(config.step);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The pose advances by the time that really passed at the velocity that held, up to each
    // tick and each command: on a busy machine ticks come late or are skipped, and a fixed
    // step per tick would make a two-second drive cover less than two seconds' distance.
    let mut moved_until = tokio::time::Instant::now();
    loop {
        tokio::select! {
            command = end.commands.recv() => {
                let Some(command) = command else { return };
                advance(&mut state, &mut moved_until, config.step);
                obey(command, &mut state, &mut goal);
            }
            _ = tick.tick() => {
                advance(&mut state, &mut moved_until, config.step);
                if let Some(event) = steer_to_goal(&mut state, &mut goal, &config) {
                    if end.events.send(event).await.is_err() {
                        return;
                    }
                }
            }
        }
        state.goal = goal.as_ref().map(|g| g.name.clone());
        end.pose.send_replace(Some(super::Pose {
            x: state.x,
            y: state.y,
            theta: state.theta,
        }));
        if let Ok(mut shared) = probe.0.lock() {
            *shared = state.clone();
        }
    }
}

/// Applies one command to the base and its goal.
fn obey(command: DriverCommand, state: &mut SimState, goal: &mut Option<Goal>) {
    match command {
        DriverCommand::Move { linear, angular } => {
            state.linear = linear;
            state.angular = angular;
        }
        DriverCommand::Stop { reason } => {
            state.linear = 0.0;
            state.angular = 0.0;
            state.last_stop = Some(reason.as_str().to_owned());
            *goal = None;
        }
        DriverCommand::Navigate {
            name,
            position,
            orientation,
            reply,
        } => {
            *goal = Some(Goal {
                name,
                position,
                yaw: orientation.and_then(|o: Orientation| o.yaw),
            });
            let _ = reply.send(Ok(()));
        }
        DriverCommand::CallTool { reply, .. } => {
            let _ = reply.send(Err(super::DriverError::Unsupported("tools")));
        }
        DriverCommand::CancelNavigation { reply } => {
            *goal = None;
            state.linear = 0.0;
            state.angular = 0.0;
            let _ = reply.send(Ok(()));
        }
    }
}

/// Sets the velocity towards the goal, if there is one; once it is reached, stops, drops
/// the goal and returns the event that says so.
fn steer_to_goal(
    state: &mut SimState,
    goal: &mut Option<Goal>,
    config: &SimConfig,
) -> Option<DriverEvent> {
    let g = goal.as_ref()?;
    if let Some((linear, angular)) = steer(state, g, config) {
        state.linear = linear;
        state.angular = angular;
        return None;
    }
    state.linear = 0.0;
    state.angular = 0.0;
    let name = g.name.clone();
    *goal = None;
    Some(DriverEvent::Navigation {
        name,
        status: NavigationStatus::Completed,
        message: None,
    })
}

/// Velocity towards the goal, or `None` once it is reached.
fn steer(state: &SimState, goal: &Goal, config: &SimConfig) -> Option<(f64, f64)> {
    let dx = goal.position.x - state.x;
    let dy = goal.position.y - state.y;
    let distance = dx.hypot(dy);
    if distance > config.position_tolerance {
        let heading_error = normalise(dy.atan2(dx) - state.theta);
        let angular = (heading_error * 3.0).clamp(-config.nav_angular, config.nav_angular);
        // Turn on the spot first when facing the wrong way, then drive,
        // slowing down on the final approach so the goal is not overshot.
        let linear = if heading_error.abs() > 0.3 {
            0.0
        } else {
            (distance * 2.0).min(config.nav_linear)
        };
        return Some((linear, angular));
    }
    if let Some(yaw) = goal.yaw {
        let error = normalise(yaw - state.theta);
        if error.abs() > config.yaw_tolerance {
            return Some((
                0.0,
                (error * 3.0).clamp(-config.nav_angular, config.nav_angular),
            ));
        }
    }
    None
}

/// Moves the robot from `moved_until` to now at its current velocity, in steps of at most
/// `step` (the arc of a turn stays close to the true one).
fn advance(state: &mut SimState, moved_until: &mut tokio::time::Instant, step: Duration) {
    let now = tokio::time::Instant::now();
    let mut left = now.saturating_duration_since(*moved_until);
    *moved_until = now;
    if state.linear == 0.0 && state.angular == 0.0 {
        return;
    }
    while !left.is_zero() {
        let dt = left.min(step);
        integrate(state, dt.as_secs_f64());
        left -= dt;
    }
}

fn integrate(state: &mut SimState, dt: f64) {
    state.x += state.linear * state.theta.cos() * dt;
    state.y += state.linear * state.theta.sin() * dt;
    state.theta = normalise(state.theta + state.angular * dt);
}

fn normalise(angle: f64) -> f64 {
    let mut a = angle % (2.0 * PI);
    if a > PI {
        a -= 2.0 * PI;
    } else if a <= -PI {
        a += 2.0 * PI;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DriverHandle;
    use crate::safety::StopReason;
    use tokio::sync::oneshot;

    #[tokio::test(start_paused = true)]
    async fn integrates_commanded_velocity() {
        let (mut handle, end) = DriverHandle::channel();
        let probe = spawn(end, SimConfig::default());
        assert_eq!(handle.events.recv().await, Some(DriverEvent::Ready));
        handle
            .commands
            .send(DriverCommand::Move {
                linear: 0.5,
                angular: 0.0,
            })
            .await
            .expect("send");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let s = probe.state();
        assert!((s.x - 1.0).abs() < 0.05, "x = {}", s.x);
        handle
            .commands
            .send(DriverCommand::Stop {
                reason: StopReason::Watchdog,
            })
            .await
            .expect("send");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopped = probe.state();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(probe.state().x, stopped.x);
        assert_eq!(stopped.last_stop.as_deref(), Some("watchdog"));
    }

    #[tokio::test(start_paused = true)]
    async fn navigates_to_the_goal_and_reports_completion() {
        let (mut handle, end) = DriverHandle::channel();
        let probe = spawn(end, SimConfig::default());
        assert_eq!(handle.events.recv().await, Some(DriverEvent::Ready));
        let (reply, accepted) = oneshot::channel();
        handle
            .commands
            .send(DriverCommand::Navigate {
                name: "dock".into(),
                position: Position {
                    x: -1.0,
                    y: 2.0,
                    z: None,
                },
                orientation: Some(Orientation {
                    yaw: Some(1.0),
                    pitch: None,
                    roll: None,
                }),
                reply,
            })
            .await
            .expect("send");
        assert!(accepted.await.expect("reply").is_ok());
        let event = tokio::time::timeout(Duration::from_secs(60), handle.events.recv())
            .await
            .expect("completes");
        assert_eq!(
            event,
            Some(DriverEvent::Navigation {
                name: "dock".into(),
                status: NavigationStatus::Completed,
                message: None
            })
        );
        let s = probe.state();
        assert!(
            (s.x + 1.0).abs() < 0.06 && (s.y - 2.0).abs() < 0.06,
            "{s:?}"
        );
        assert!((s.theta - 1.0).abs() < 0.06, "{s:?}");
        assert_eq!(s.goal, None);
    }

    #[test]
    fn angles_normalise() {
        assert!((normalise(3.0 * PI) - PI).abs() < 1e-9);
        assert!((normalise(-3.0 * PI / 2.0) - PI / 2.0).abs() < 1e-9);
    }
}
