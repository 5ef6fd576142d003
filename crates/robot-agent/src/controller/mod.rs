//! The controller: one task that owns the safety state, the navigation state
//! ([`navigation`]) and the driver. Sessions talk to it through a bounded channel, so every
//! motion decision is made in one place, in order, whatever the number of
//! sessions.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use signalling_protocol::{Envelope, ErrorCode, Location, NavigationStatus};
use tokio::sync::{mpsc, oneshot, watch};

use crate::driver::{DriverCommand, DriverError, DriverEvent, DriverHandle};
use crate::messages;

pub mod control;
mod navigation;

use crate::safety::{Refusal, Role, SafetyCore, SafetyLimits, StopReason};
use control::{Busy, Claimant, ControlLock};
use navigation::{Navigation, Notice};

/// Capacity of the request channel: sessions wait (briefly) when it is full.
const REQUEST_CAPACITY: usize = 64;
/// Watchdog resolution: how often the dead-man timeout is checked.
const WATCHDOG_TICK: Duration = Duration::from_millis(25);

/// Why a navigation command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NavRefusal {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("already navigating to {0:?}")]
    AlreadyActive(String),
    #[error("no navigation in progress")]
    NotActive,
}

/// A snapshot of the controller's state (diagnostics and tests).
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub moving: bool,
    pub estop: Option<String>,
    pub driver_ready: bool,
    pub navigating: Option<String>,
    pub sessions: usize,
}

enum Request {
    Attach {
        session: String,
        outbox: mpsc::Sender<Envelope>,
    },
    Detach {
        session: String,
        reason: StopReason,
        /// Keep the outbox: the session may recover (ICE "disconnected").
        keep: bool,
    },
    Movement {
        session: String,
        role: Role,
        forward: f64,
        turn: f64,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    Navigate {
        session: String,
        role: Role,
        correlation: String,
        location: Location,
        reply: oneshot::Sender<Result<(), NavRefusal>>,
    },
    CancelNavigation {
        role: Role,
        reply: oneshot::Sender<Result<String, NavRefusal>>,
    },
    SetLimits(SafetyLimits),
    ResetEstop {
        role: Role,
        reply: oneshot::Sender<Result<bool, Refusal>>,
    },
    StopAll(StopReason),
    /// An emergency stop asked by a party (ARP `arp.emergencyStop`), not
    /// the driver: latched exactly the same way.
    EmergencyStop {
        reason: String,
        reply: oneshot::Sender<()>,
    },
    Status(oneshot::Sender<Status>),
    /// A driver-declared tool: admitted like a motion command (role, e-stop
    /// latch, rate), then handed to the driver.
    DriverTool {
        session: String,
        role: Role,
        name: String,
        arguments: Value,
        reply: oneshot::Sender<Result<DriverAnswer, Refusal>>,
    },
}

/// The driver's eventual answer to a tool call.
pub type DriverAnswer = oneshot::Receiver<Result<Value, DriverError>>;

/// Cheap, cloneable access to the controller.
#[derive(Clone)]
pub struct ControllerHandle {
    tx: mpsc::Sender<Request>,
    /// The latched e-stop's reason (`None` when clear), for callers that
    /// must react the moment it latches (running ARP tool calls).
    estop: watch::Receiver<Option<String>>,
    /// Who holds the robot's control (one controller across teleop and
    /// ARP); motion from anyone else is refused below.
    control: ControlLock,
}

impl ControllerHandle {
    /// Takes the robot's control (a teleop session at its offer, an ARP
    /// connection at `arp.initialize`), unless the other side holds it.
    pub fn take_control(&self, who: &Claimant) -> Result<(), Busy> {
        let taken = self.control.take(who);
        if taken.is_err() {
            tracing::info!(?who, "control refused: another controller holds the robot");
        }
        taken
    }

    /// Gives control back (no-op for a key that holds none).
    pub fn release_control(&self, key: &str) {
        self.control.release(key);
    }

    /// Registers a session's outbox for asynchronous messages (navigation
    /// progress, emergency stops).
    pub async fn attach(&self, session: &str, outbox: mpsc::Sender<Envelope>) {
        let _ = self
            .tx
            .send(Request::Attach {
                session: session.to_owned(),
                outbox,
            })
            .await;
    }

    /// The session is gone; stops the robot if it was the one driving, and
    /// releases its control.
    pub async fn detach(&self, session: &str, reason: StopReason) {
        self.control.release(session);
        let _ = self
            .tx
            .send(Request::Detach {
                session: session.to_owned(),
                reason,
                keep: false,
            })
            .await;
    }

    /// The session's link is interrupted (it may come back): stop the robot
    /// if this session was driving, but keep the session registered.
    pub async fn interrupted(&self, session: &str, reason: StopReason) {
        let _ = self
            .tx
            .send(Request::Detach {
                session: session.to_owned(),
                reason,
                keep: true,
            })
            .await;
    }

    pub async fn movement(
        &self,
        session: &str,
        role: Role,
        forward: f64,
        turn: f64,
    ) -> Result<(), Refusal> {
        let (reply, answer) = oneshot::channel();
        self.ask(
            Request::Movement {
                session: session.to_owned(),
                role,
                forward,
                turn,
                reply,
            },
            answer,
        )
        .await
        .unwrap_or(Err(Refusal::DriverUnavailable))
    }

    /// Starts navigating; `started` (or `failed`) follows asynchronously on
    /// the session's outbox, correlated with `correlation`.
    pub async fn navigate(
        &self,
        session: &str,
        role: Role,
        correlation: &str,
        location: Location,
    ) -> Result<(), NavRefusal> {
        let (reply, answer) = oneshot::channel();
        self.ask(
            Request::Navigate {
                session: session.to_owned(),
                role,
                correlation: correlation.to_owned(),
                location,
                reply,
            },
            answer,
        )
        .await
        .unwrap_or(Err(NavRefusal::Refused(Refusal::DriverUnavailable)))
    }

    /// Cancels the current navigation; returns the location's name.
    pub async fn cancel_navigation(&self, role: Role) -> Result<String, NavRefusal> {
        let (reply, answer) = oneshot::channel();
        self.ask(Request::CancelNavigation { role, reply }, answer)
            .await
            .unwrap_or(Err(NavRefusal::Refused(Refusal::DriverUnavailable)))
    }

    pub async fn set_limits(&self, limits: SafetyLimits) {
        let _ = self.tx.send(Request::SetLimits(limits)).await;
    }

    /// Clears a latched emergency stop; returns whether one was latched.
    pub async fn reset_estop(&self, role: Role) -> Result<bool, Refusal> {
        let (reply, answer) = oneshot::channel();
        self.ask(Request::ResetEstop { role, reply }, answer)
            .await
            .unwrap_or(Err(Refusal::DriverUnavailable))
    }

    /// Latches an emergency stop from any party (viewers too): the robot
    /// stops, navigation fails, and motion is refused until an operator
    /// resets it. Returns once the stop has been handed to the driver.
    pub async fn emergency_stop(&self, reason: &str) {
        let (reply, answer) = oneshot::channel();
        self.ask(
            Request::EmergencyStop {
                reason: reason.to_owned(),
                reply,
            },
            answer,
        )
        .await;
    }

    /// Admits and starts a driver-declared tool; the driver's answer comes
    /// on the returned receiver.
    pub async fn driver_tool(
        &self,
        session: &str,
        role: Role,
        name: &str,
        arguments: Value,
    ) -> Result<DriverAnswer, Refusal> {
        let (reply, answer) = oneshot::channel();
        self.ask(
            Request::DriverTool {
                session: session.to_owned(),
                role,
                name: name.to_owned(),
                arguments,
                reply,
            },
            answer,
        )
        .await
        .unwrap_or(Err(Refusal::DriverUnavailable))
    }

    /// Watches the e-stop latch (its reason while latched).
    pub fn estop_watch(&self) -> watch::Receiver<Option<String>> {
        self.estop.clone()
    }

    /// Stops the robot and aborts navigation (e.g. signalling lost).
    pub async fn stop_all(&self, reason: StopReason) {
        let _ = self.tx.send(Request::StopAll(reason)).await;
    }

    pub async fn status(&self) -> Option<Status> {
        let (reply, answer) = oneshot::channel();
        self.ask(Request::Status(reply), answer).await
    }

    async fn ask<T>(&self, request: Request, answer: oneshot::Receiver<T>) -> Option<T> {
        self.tx.send(request).await.ok()?;
        answer.await.ok()
    }
}

struct Controller {
    safety: SafetyCore,
    driver: mpsc::Sender<DriverCommand>,
    driver_ready: bool,
    sessions: HashMap<String, mpsc::Sender<Envelope>>,
    nav: Navigation,
    estop: watch::Sender<Option<String>>,
    control: ControlLock,
}

/// Starts the controller task in front of `driver`.
pub fn spawn(limits: SafetyLimits, driver: DriverHandle) -> ControllerHandle {
    let (tx, rx) = mpsc::channel(REQUEST_CAPACITY);
    let (estop_tx, estop) = watch::channel(None);
    let control = ControlLock::default();
    tokio::spawn(run(limits, driver, rx, estop_tx, control.clone()));
    ControllerHandle { tx, estop, control }
}

fn now() -> std::time::Instant {
    // Tokio's clock, so tests with paused time drive the watchdog too.
    tokio::time::Instant::now().into_std()
}

async fn run(
    limits: SafetyLimits,
    driver: DriverHandle,
    mut rx: mpsc::Receiver<Request>,
    estop: watch::Sender<Option<String>>,
    control: ControlLock,
) {
    let DriverHandle {
        commands,
        mut events,
        ..
    } = driver;
    let (accepted_tx, mut accepted_rx) = mpsc::channel(8);
    let mut c = Controller {
        safety: SafetyCore::new(limits),
        driver: commands,
        driver_ready: false,
        sessions: HashMap::new(),
        nav: Navigation::new(accepted_tx),
        estop,
        control,
    };
    let mut tick = tokio::time::interval(WATCHDOG_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut driver_alive = true;
    loop {
        tokio::select! {
            request = rx.recv() => {
                let Some(request) = request else { break };
                c.handle(request);
            }
            event = events.recv(), if driver_alive => {
                match event {
                    Some(event) => c.driver_event(event),
                    None => {
                        driver_alive = false;
                        c.driver_event(DriverEvent::Unavailable { reason: "driver task ended".into() });
                    }
                }
            }
            Some((id, result)) = accepted_rx.recv() => c.navigation_accepted(id, result),
            _ = tick.tick() => {
                if let Some(reason) = c.safety.watchdog(now()) {
                    tracing::info!("dead-man watchdog: no movement command in time; stopping");
                    c.send_stop(reason);
                }
            }
        }
    }
    // Every handle is gone: the agent is shutting down.
    c.send_stop(StopReason::Shutdown);
}

impl Controller {
    fn handle(&mut self, request: Request) {
        match request {
            Request::Attach { session, outbox } => {
                self.sessions.insert(session, outbox);
            }
            Request::Detach {
                session,
                reason,
                keep,
            } => self.detach(&session, reason, keep),
            Request::Movement {
                session,
                role,
                forward,
                turn,
                reply,
            } => {
                let _ = reply.send(self.movement(&session, role, forward, turn));
            }
            Request::Navigate {
                session,
                role,
                correlation,
                location,
                reply,
            } => {
                let _ = reply.send(self.navigate(session, role, correlation, location));
            }
            Request::CancelNavigation { role, reply } => {
                let _ = reply.send(self.cancel(role));
            }
            Request::SetLimits(limits) => self.safety.set_limits(limits),
            Request::ResetEstop { role, reply } => {
                let result = self.safety.reset_estop(role);
                if result == Ok(true) {
                    tracing::warn!(role = role.as_str(), "emergency stop reset by operator");
                    self.estop.send_replace(None);
                }
                let _ = reply.send(result);
            }
            Request::StopAll(reason) => {
                let notice = self
                    .nav
                    .finish(NavigationStatus::Failed, Some(reason.as_str().into()));
                self.deliver(notice);
                self.send_stop(reason);
            }
            Request::EmergencyStop { reason, reply } => {
                tracing::error!(%reason, "emergency stop requested; latched");
                self.emergency_stop(&reason);
                let _ = reply.send(());
            }
            Request::DriverTool {
                session,
                role,
                name,
                arguments,
                reply,
            } => {
                let _ = reply.send(self.driver_tool(&session, role, name, arguments));
            }
            Request::Status(reply) => {
                let _ = reply.send(self.status());
            }
        }
    }

    /// A session's end: its navigation fails, and the robot stops if it drove.
    fn detach(&mut self, session: &str, reason: StopReason, keep: bool) {
        if !keep {
            self.sessions.remove(session);
        }
        let owned_nav = self.nav.owned_by(session);
        if owned_nav {
            let notice = self
                .nav
                .finish(NavigationStatus::Failed, Some(reason.as_str().into()));
            self.deliver(notice);
        }
        if self.safety.session_ended(session) || owned_nav {
            tracing::info!(%session, reason = reason.as_str(), "driving session ended; stopping");
            self.send_stop(reason);
        }
    }

    fn status(&self) -> Status {
        Status {
            moving: self.safety.is_moving(),
            estop: self.safety.estop().map(str::to_owned),
            driver_ready: self.driver_ready,
            navigating: self.nav.active().map(str::to_owned),
            sessions: self.sessions.len(),
        }
    }

    fn movement(
        &mut self,
        session: &str,
        role: Role,
        forward: f64,
        turn: f64,
    ) -> Result<(), Refusal> {
        if !role.may_drive() {
            return Err(Refusal::Forbidden(role.as_str()));
        }
        self.holds_control(session)?;
        if !self.driver_ready {
            return Err(Refusal::DriverUnavailable);
        }
        let velocity = self.safety.movement(now(), session, role, forward, turn)?;
        let nonzero = velocity.linear != 0.0 || velocity.angular != 0.0;
        if self.nav.active().is_some() {
            if !nonzero {
                // An idle joystick must not fight the navigation stack.
                return Ok(());
            }
            // Manual control takes over from navigation.
            let notice = self.nav.preempt(&self.driver);
            self.deliver(notice);
        }
        self.driver
            .try_send(DriverCommand::Move {
                linear: velocity.linear,
                angular: velocity.angular,
            })
            .map_err(|_| {
                // Could not deliver: make sure nothing keeps moving.
                self.send_stop(StopReason::Watchdog);
                Refusal::DriverBusy
            })
    }

    fn driver_tool(
        &mut self,
        session: &str,
        role: Role,
        name: String,
        arguments: Value,
    ) -> Result<DriverAnswer, Refusal> {
        if !role.may_drive() {
            return Err(Refusal::Forbidden(role.as_str()));
        }
        self.holds_control(session)?;
        if !self.driver_ready {
            return Err(Refusal::DriverUnavailable);
        }
        self.safety.admit(now(), role)?;
        let (reply, answer) = oneshot::channel();
        self.driver
            .try_send(DriverCommand::CallTool {
                name,
                arguments,
                reply,
            })
            .map_err(|_| Refusal::DriverBusy)?;
        Ok(answer)
    }

    fn navigate(
        &mut self,
        session: String,
        role: Role,
        correlation: String,
        location: Location,
    ) -> Result<(), NavRefusal> {
        if !role.may_drive() {
            return Err(Refusal::Forbidden(role.as_str()).into());
        }
        self.holds_control(&session)?;
        self.nav.check_idle()?;
        if !self.driver_ready {
            return Err(Refusal::DriverUnavailable.into());
        }
        self.safety.admit(now(), role)?;
        if self.safety.is_moving() {
            // Hand over from manual driving cleanly.
            self.send_stop(StopReason::NavigationCancelled);
        }
        self.nav.start(&self.driver, session, correlation, location)
    }

    /// One controller: motion from anyone but the holder of control
    /// (teleop or ARP) never reaches the driver.
    fn holds_control(&self, session: &str) -> Result<(), Refusal> {
        if self.control.admits(session) {
            Ok(())
        } else {
            Err(Refusal::RobotBusy)
        }
    }

    fn cancel(&mut self, role: Role) -> Result<String, NavRefusal> {
        if !role.may_drive() {
            return Err(Refusal::Forbidden(role.as_str()).into());
        }
        let (name, notice, queued) = self.nav.cancel(&self.driver)?;
        if !queued {
            // The cancel could not be queued: a stop halts navigation too.
            self.send_stop(StopReason::NavigationCancelled);
        }
        self.deliver(Some(notice));
        Ok(name)
    }

    fn navigation_accepted(&mut self, id: u64, result: Result<(), DriverError>) {
        let notice = self.nav.accepted(id, result);
        self.deliver(notice);
    }

    fn driver_event(&mut self, event: DriverEvent) {
        match event {
            DriverEvent::Ready => {
                tracing::info!("driver ready");
                self.driver_ready = true;
            }
            DriverEvent::Unavailable { reason } => {
                if self.driver_ready {
                    tracing::warn!(%reason, "driver unavailable; robot held stopped");
                }
                self.driver_ready = false;
                self.safety.stopped();
                let notice = self.nav.finish(
                    NavigationStatus::Failed,
                    Some(format!("driver unavailable: {reason}")),
                );
                self.deliver(notice);
            }
            DriverEvent::Navigation {
                name,
                status,
                message,
            } => {
                let notice = self.nav.driver_status(&name, status, message);
                self.deliver(notice);
            }
            DriverEvent::EmergencyStop { reason } => {
                tracing::error!(%reason, "emergency stop from driver; latched");
                self.emergency_stop(&reason);
            }
        }
    }

    /// Stops and latches; every session hears of it.
    fn emergency_stop(&mut self, reason: &str) {
        self.safety.emergency_stop(reason);
        // The stop first: nothing below may delay it.
        self.send_stop(StopReason::EmergencyStop);
        // Before the navigation notice, so whoever hears "failed" can tell
        // it was the e-stop.
        self.estop.send_replace(Some(reason.to_owned()));
        let notice = self.nav.finish(
            NavigationStatus::Failed,
            Some(format!("emergency stop: {reason}")),
        );
        self.deliver(notice);
        let sessions: Vec<String> = self.sessions.keys().cloned().collect();
        for session in sessions {
            let envelope = messages::error(
                ErrorCode::MovementFailed,
                format!("emergency stop: {reason}"),
                Some(messages::details(
                    "emergency_stop",
                    &[
                        ("latched", Value::Bool(true)),
                        ("detail", Value::String(reason.to_owned())),
                    ],
                )),
                None,
            );
            self.send_to(&session, envelope);
        }
    }

    fn deliver(&mut self, notice: Option<Notice>) {
        if let Some(Notice { session, envelope }) = notice {
            self.send_to(&session, envelope);
        }
    }

    fn send_to(&mut self, session: &str, envelope: Envelope) {
        if let Some(outbox) = self.sessions.get(session) {
            if outbox.try_send(envelope).is_err() {
                tracing::warn!(%session, "session outbox full or closed; message dropped");
            }
        }
    }

    /// Stops the robot. A stop must never be lost: if the driver's queue is
    /// full it is delivered from a task that waits for room.
    fn send_stop(&mut self, reason: StopReason) {
        self.safety.stopped();
        if let Err(mpsc::error::TrySendError::Full(command)) =
            self.driver.try_send(DriverCommand::Stop { reason })
        {
            let driver = self.driver.clone();
            tokio::spawn(async move {
                let _ = driver.send(command).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DriverEnd;
    use crate::testutil::{validated, WAIT};
    use signalling_protocol::Position;

    fn location(name: &str) -> Location {
        Location {
            name: name.into(),
            position: Position {
                x: 1.0,
                y: 0.0,
                z: None,
            },
            orientation: None,
            metadata: None,
        }
    }

    async fn setup() -> (ControllerHandle, DriverEnd) {
        let (handle, end) = DriverHandle::channel();
        let controller = spawn(SafetyLimits::default(), handle);
        end.events.send(DriverEvent::Ready).await.expect("ready");
        // Status round-trip: the Ready event has been processed after it.
        let deadline = tokio::time::Instant::now() + WAIT;
        while !controller.status().await.expect("status").driver_ready {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::task::yield_now().await;
        }
        (controller, end)
    }

    async fn next_command(end: &mut DriverEnd) -> DriverCommand {
        tokio::time::timeout(WAIT, end.commands.recv())
            .await
            .expect("command in time")
            .expect("command")
    }

    #[tokio::test(start_paused = true)]
    async fn movement_reaches_the_driver_scaled_and_the_watchdog_stops_it() {
        let (c, mut end) = setup().await;
        c.movement("s1", Role::Operator, 1.0, -0.5)
            .await
            .expect("moves");
        match next_command(&mut end).await {
            DriverCommand::Move { linear, angular } => {
                assert_eq!((linear, angular), (0.5, -0.5));
            }
            other => panic!("unexpected {other:?}"),
        }
        // No further commands: the dead-man watchdog fires at 300 ms.
        let before = tokio::time::Instant::now();
        match next_command(&mut end).await {
            DriverCommand::Stop { reason } => assert_eq!(reason, StopReason::Watchdog),
            other => panic!("unexpected {other:?}"),
        }
        let waited = before.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_millis(400),
            "{waited:?}"
        );
        assert!(!c.status().await.expect("status").moving);
    }

    #[tokio::test(start_paused = true)]
    async fn viewers_are_refused_and_the_driving_session_ending_stops() {
        let (c, mut end) = setup().await;
        assert_eq!(
            c.movement("v", Role::Viewer, 0.5, 0.0).await,
            Err(Refusal::Forbidden("viewer"))
        );
        assert_eq!(
            c.navigate("v", Role::Viewer, "n1", location("a")).await,
            Err(NavRefusal::Refused(Refusal::Forbidden("viewer")))
        );
        c.movement("op", Role::Owner, 0.2, 0.0)
            .await
            .expect("moves");
        assert!(matches!(
            next_command(&mut end).await,
            DriverCommand::Move { .. }
        ));
        c.detach("v", StopReason::SessionEnded).await;
        c.detach("op", StopReason::PeerDisconnected).await;
        match next_command(&mut end).await {
            DriverCommand::Stop { reason } => assert_eq!(reason, StopReason::PeerDisconnected),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn motion_from_anyone_but_the_holder_never_reaches_the_driver() {
        let (c, mut end) = setup().await;
        let arp = Claimant::Arp {
            key: "arp-local-1".into(),
            session: None,
        };
        c.take_control(&arp).expect("free");
        assert_eq!(c.take_control(&Claimant::Teleop("s1".into())), Err(Busy));
        assert_eq!(
            c.movement("s1", Role::Operator, 0.5, 0.0).await,
            Err(Refusal::RobotBusy)
        );
        assert_eq!(
            c.navigate("s1", Role::Owner, "n1", location("a")).await,
            Err(NavRefusal::Refused(Refusal::RobotBusy))
        );
        assert!(matches!(
            c.driver_tool("s1", Role::Operator, "dock", Value::Null)
                .await,
            Err(Refusal::RobotBusy)
        ));
        assert!(
            end.commands.try_recv().is_err(),
            "nothing reached the driver"
        );
        c.movement("arp-local-1", Role::Operator, 0.5, 0.0)
            .await
            .expect("the holder moves");
        assert!(matches!(
            next_command(&mut end).await,
            DriverCommand::Move { .. }
        ));
        // The holder goes away: control is free again.
        c.detach("arp-local-1", StopReason::SessionEnded).await;
        c.take_control(&Claimant::Teleop("s1".into()))
            .expect("free again");
        c.movement("s1", Role::Operator, 0.5, 0.0)
            .await
            .expect("the new holder moves");
    }

    #[tokio::test(start_paused = true)]
    async fn emergency_stop_latches_and_is_broadcast() {
        let (c, mut end) = setup().await;
        let (outbox, mut inbox) = mpsc::channel(8);
        c.attach("op", outbox).await;
        c.status().await.expect("attach processed");
        end.events
            .send(DriverEvent::EmergencyStop {
                reason: "bumper".into(),
            })
            .await
            .expect("event");
        match next_command(&mut end).await {
            DriverCommand::Stop { reason } => assert_eq!(reason, StopReason::EmergencyStop),
            other => panic!("unexpected {other:?}"),
        }
        let error = validated(&inbox.recv().await.expect("broadcast"));
        assert_eq!(error["payload"]["code"], "MOVEMENT_FAILED");
        assert_eq!(error["payload"]["details"]["reason"], "emergency_stop");
        assert_eq!(
            c.movement("op", Role::Operator, 0.1, 0.0).await,
            Err(Refusal::EmergencyStop("bumper".into()))
        );
        assert_eq!(
            c.reset_estop(Role::Viewer).await,
            Err(Refusal::Forbidden("viewer"))
        );
        assert_eq!(c.reset_estop(Role::Operator).await, Ok(true));
        c.movement("op", Role::Operator, 0.1, 0.0)
            .await
            .expect("moves again");
    }

    #[tokio::test(start_paused = true)]
    async fn unavailable_driver_holds_the_robot() {
        let (c, end) = setup().await;
        end.events
            .send(DriverEvent::Unavailable {
                reason: "crashed".into(),
            })
            .await
            .expect("event");
        let deadline = tokio::time::Instant::now() + WAIT;
        while c.status().await.expect("status").driver_ready {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::task::yield_now().await;
        }
        assert_eq!(
            c.movement("op", Role::Operator, 0.1, 0.0).await,
            Err(Refusal::DriverUnavailable)
        );
    }

    /// The driver accepts the pending goal; the session hears `started`.
    async fn accept(end: &mut DriverEnd, inbox: &mut mpsc::Receiver<Envelope>) {
        match next_command(end).await {
            DriverCommand::Navigate { reply, .. } => reply.send(Ok(())).expect("reply"),
            other => panic!("unexpected {other:?}"),
        }
        let started = validated(&inbox.recv().await.expect("started"));
        assert_eq!(started["payload"]["status"], "started");
    }

    /// An idle joystick leaves a navigation be; a moving one cancels it.
    async fn joystick_preempts_navigation(c: &ControllerHandle, end: &mut DriverEnd) {
        c.movement("op", Role::Operator, 0.0, 0.0)
            .await
            .expect("idle joystick");
        assert_eq!(
            c.status().await.expect("status").navigating.as_deref(),
            Some("dock")
        );
        c.movement("op", Role::Operator, 0.3, 0.0)
            .await
            .expect("takes over");
        assert!(matches!(
            next_command(end).await,
            DriverCommand::CancelNavigation { .. }
        ));
        assert!(matches!(
            next_command(end).await,
            DriverCommand::Move { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn navigation_lifecycle() {
        let (c, mut end) = setup().await;
        let (outbox, mut inbox) = mpsc::channel(8);
        c.attach("op", outbox).await;
        c.navigate("op", Role::Operator, "req-1", location("dock"))
            .await
            .expect("accepted for processing");
        assert_eq!(
            c.navigate("op", Role::Operator, "req-2", location("desk"))
                .await,
            Err(NavRefusal::AlreadyActive("dock".into()))
        );
        match next_command(&mut end).await {
            DriverCommand::Navigate { name, reply, .. } => {
                assert_eq!(name, "dock");
                reply.send(Ok(())).expect("reply");
            }
            other => panic!("unexpected {other:?}"),
        }
        let started = validated(&inbox.recv().await.expect("started"));
        assert_eq!(started["payload"]["status"], "started");
        assert_eq!(started["correlationId"], "req-1");
        end.events
            .send(DriverEvent::Navigation {
                name: "dock".into(),
                status: NavigationStatus::Completed,
                message: None,
            })
            .await
            .expect("event");
        let done = validated(&inbox.recv().await.expect("completed"));
        assert_eq!(done["payload"]["status"], "completed");
        assert_eq!(done["correlationId"], "req-1");
        assert_eq!(
            c.cancel_navigation(Role::Operator).await,
            Err(NavRefusal::NotActive)
        );

        // A refused goal is reported as failed.
        c.navigate("op", Role::Operator, "req-3", location("pit"))
            .await
            .expect("queued");
        match next_command(&mut end).await {
            DriverCommand::Navigate { reply, .. } => {
                reply
                    .send(Err(DriverError::Refused {
                        code: 2,
                        message: "no path".into(),
                    }))
                    .expect("reply");
            }
            other => panic!("unexpected {other:?}"),
        }
        let failed = validated(&inbox.recv().await.expect("failed"));
        assert_eq!(failed["payload"]["status"], "failed");
        assert_eq!(failed["correlationId"], "req-3");

        // Cancel, and manual preemption.
        c.navigate("op", Role::Operator, "req-4", location("dock"))
            .await
            .expect("queued");
        accept(&mut end, &mut inbox).await;
        assert_eq!(c.cancel_navigation(Role::Operator).await, Ok("dock".into()));
        assert!(matches!(
            next_command(&mut end).await,
            DriverCommand::CancelNavigation { .. }
        ));
        let cancelled = validated(&inbox.recv().await.expect("cancelled"));
        assert_eq!(cancelled["payload"]["status"], "cancelled");
        assert_eq!(cancelled["correlationId"], "req-4");

        c.navigate("op", Role::Operator, "req-5", location("dock"))
            .await
            .expect("queued");
        accept(&mut end, &mut inbox).await;
        joystick_preempts_navigation(&c, &mut end).await;
        let preempted = validated(&inbox.recv().await.expect("preempted"));
        assert_eq!(preempted["payload"]["status"], "cancelled");
        assert_eq!(preempted["correlationId"], "req-5");
    }
}
