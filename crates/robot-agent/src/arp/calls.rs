//! `arp.callTool`: admission (role, arguments, constraints, idempotency,
//! one motion at a time), confirmation, and running each tool to its end.
//! Every motion goes through the controller, i.e. the safety layer.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use signalling_protocol::arp::method;
use signalling_protocol::{Location, NavigationStatus, Orientation, Position};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::connection::{error_response, notification, parse, response, Conn, Link};
use super::tools::{Args, DriveArgs, Tool, ToolKind};
use super::{lock, ArpError, ArpServer, Outcome, Peer, Running, ViolationAction};
use crate::locations::LocationError;
use crate::safety::StopReason;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CallParams {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
    idempotency_key: Option<String>,
}

/// How a call ended well: its state and optional result.
type Ended = (&'static str, Option<Value>);

/// Everything a running call needs.
struct Call {
    id: String,
    server: ArpServer,
    peer: Peer,
    link: Link,
    tool: Tool,
    arguments: Value,
    cancel: watch::Receiver<bool>,
    /// The caller declared that it answers confirmations.
    client_confirms: bool,
}

impl Conn {
    /// `arp.callTool`: admits a call; its response is sent by the call's task (`Ok(None)`).
    pub(super) fn call_tool(&self, id: &Value, params: &Value) -> Result<Option<Value>, ArpError> {
        start(self, id, params)
    }
}

/// Admits a call; its response is sent by the call's task (`Ok(None)`).
fn start(conn: &Conn, id: &Value, params: &Value) -> Result<Option<Value>, ArpError> {
    let p: CallParams = parse(params)?;
    let arguments = checked_arguments(&p)?;
    let server = &conn.server;
    let tool = server
        .tool(&p.name)
        .ok_or_else(|| ArpError::ToolNotFound(p.name.clone()))?;
    let role = conn.peer.role;
    if !role.may_drive() && !tool.kind.viewer_may_call() {
        return Err(ArpError::Forbidden(role.as_str()));
    }
    let args = super::tools::parse_args(&tool, &arguments)?;
    let call_id = format!("call-{}", server.next_id());
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let (outcome_tx, outcome_rx) = watch::channel(None);
    {
        let mut state = server.state();
        if let Some(key) = &p.idempotency_key {
            let remembered = state
                .idempotency
                .get(&(conn.peer.subject.clone(), key.clone()), Instant::now());
            if let Some(outcome) = remembered {
                // A retry: the first call's outcome, never a second run.
                tracing::info!(key = %conn.peer.key, idempotency_key = %key, "retried call attached to its first run");
                tokio::spawn(answer_when_done(conn.link.clone(), id.clone(), outcome));
                return Ok(None);
            }
        }
        if tool.moves() {
            if let Some(active) = &state.motion {
                return Err(ArpError::ToolBusy {
                    active: active.clone(),
                });
            }
            state.motion = Some(call_id.clone());
        }
        state.calls.insert(
            call_id.clone(),
            Running {
                tool: tool.name.clone(),
                owner: conn.peer.key.clone(),
                cancel: cancel_tx,
            },
        );
        if let Some(key) = p.idempotency_key {
            state
                .idempotency
                .insert((conn.peer.subject.clone(), key), outcome_rx, Instant::now());
        }
    }
    tracing::info!(key = %conn.peer.key, subject = %conn.peer.subject, call = %call_id, tool = tool.name, arguments = %arguments, "ARP tool call");
    let call = Call {
        id: call_id,
        server: server.clone(),
        peer: conn.peer.clone(),
        link: conn.link.clone(),
        tool,
        arguments,
        cancel: cancel_rx,
        client_confirms: conn.client_confirms,
    };
    tokio::spawn(run_and_answer(call, args, id.clone(), outcome_tx));
    Ok(None)
}

/// The call's arguments (an object; none: `{}`), its idempotency key checked.
fn checked_arguments(p: &CallParams) -> Result<Value, ArpError> {
    let arguments = p.arguments.clone().unwrap_or_else(|| json!({}));
    if !arguments.is_object() {
        return Err(ArpError::InvalidParams {
            field: Some("arguments".into()),
            message: "arguments: must be an object".into(),
        });
    }
    if p.idempotency_key
        .as_ref()
        .is_some_and(|k| k.is_empty() || k.len() > 128)
    {
        return Err(ArpError::InvalidParams {
            field: Some("idempotencyKey".into()),
            message: "idempotencyKey: 1 to 128 characters".into(),
        });
    }
    Ok(arguments)
}

/// The call's task: runs it, answers the request, publishes the outcome
/// (for retries) and frees the call's place.
async fn run_and_answer(
    call: Call,
    args: Args,
    request_id: Value,
    outcome_tx: watch::Sender<Option<Outcome>>,
) {
    let call_id = call.id.clone();
    let server = call.server.clone();
    let link = call.link.clone();
    let tool = call.tool.name.clone();
    let outcome: Outcome = match run(call, args).await {
        Ok((state, result)) => {
            let mut body = json!({ "callId": call_id, "state": state });
            if let Some(result) = result {
                body["result"] = result;
            }
            Ok(body)
        }
        Err(e) => Err((call_id.clone(), e)),
    };
    match &outcome {
        Ok(body) => {
            tracing::info!(call = %call_id, tool, state = %body["state"], "ARP tool call ended")
        }
        Err((_, e)) => {
            tracing::info!(call = %call_id, tool, error = %e, "ARP tool call failed")
        }
    }
    // The call's place is free before its answer leaves: a client may start the next
    // motion the moment it reads the answer, and must not find this one still in the way
    // (it did, now and then, on a busy machine: `tool_busy` for a call already answered).
    {
        let mut state = server.state();
        state.calls.remove(&call_id);
        if state.motion.as_deref() == Some(call_id.as_str()) {
            state.motion = None;
        }
    }
    let answer = render(&request_id, &outcome);
    outcome_tx.send_replace(Some(outcome));
    link.send(answer).await;
}

fn render(id: &Value, outcome: &Outcome) -> Value {
    match outcome {
        Ok(body) => response(id, body.clone()),
        Err((call_id, e)) => {
            let mut extra = Map::new();
            extra.insert("callId".into(), json!(call_id));
            extra.insert("state".into(), json!("failed"));
            error_response(id, e, Some(extra))
        }
    }
}

/// Answers a retry with the first run's outcome, once there is one.
async fn answer_when_done(link: Link, id: Value, mut outcome: watch::Receiver<Option<Outcome>>) {
    let done = outcome.wait_for(Option::is_some).await.map(|o| o.clone());
    match done {
        Ok(Some(outcome)) => link.send(render(&id, &outcome)).await,
        _ => {
            link.send(error_response(&id, &ArpError::Internal, None))
                .await
        }
    }
}

async fn run(mut call: Call, args: Args) -> Result<Ended, ArpError> {
    let controller = call.server.shared().controller.clone();
    let mut estop = controller.estop_watch();
    let latched = estop.borrow_and_update().clone();
    if call.tool.moves() || call.tool.kind == ToolKind::Driver {
        // The first progress names the callId before anything else happens.
        call.progress(0.0, "accepted");
        if let Some(reason) = latched {
            return Err(ArpError::EmergencyStopped(reason));
        }
    }
    // Constraints are checked before asking a human, so nobody confirms
    // what would be refused anyway.
    let prepared = match &args {
        Args::Drive(d) => Prepared::Drive(call.check_drive(*d)?),
        Args::Navigate(n) => Prepared::Navigate(call.check_navigate(&n.location)?),
        Args::Save(s) => Prepared::Save(s.name.clone()),
        Args::Driver(_) | Args::None => Prepared::None,
    };
    if call.tool.requires_confirmation && !call.confirm(&mut estop).await? {
        return Ok((
            "cancelled",
            Some(json!({ "reason": "cancelled before confirmation" })),
        ));
    }
    match (call.tool.kind, prepared) {
        (ToolKind::Drive, Prepared::Drive(d)) => call.drive(d, &mut estop).await,
        (ToolKind::NavigateTo, Prepared::Navigate(location)) => {
            call.navigate(location, &mut estop).await
        }
        (ToolKind::Stop, _) => {
            let cancelled = call.server.cancel_motion();
            controller.stop_all(StopReason::CallEnded).await;
            Ok((
                "completed",
                Some(json!({ "stopped": true, "cancelled": cancelled })),
            ))
        }
        (ToolKind::CancelNavigation, _) => cancel_navigation(&call, &controller).await,
        (ToolKind::SaveLocation, Prepared::Save(name)) => call.save_location(name),
        (ToolKind::Driver, _) => call.driver_tool(&mut estop).await,
        (ToolKind::ListLocations, _) => {
            let list = lock(&call.server.shared().locations).list();
            Ok(("completed", Some(json!({ "locations": list }))))
        }
        (ToolKind::CaptureImage, _) => call.server.capture_image().await,
        (ToolKind::ResetEmergencyStop, _) => {
            let was = controller.reset_estop(call.peer.role).await?;
            tracing::warn!(subject = %call.peer.subject, was_latched = was, "emergency stop reset over ARP");
            Ok(("completed", Some(json!({ "reset": was }))))
        }
        _ => Err(ArpError::Internal),
    }
}

/// `cancel_navigation`: a navigate_to call in progress cancels its own
/// goal (and answers `cancelled`); else the controller's navigation ends.
async fn cancel_navigation(
    call: &Call,
    controller: &crate::controller::ControllerHandle,
) -> Result<Ended, ArpError> {
    let navigating = {
        let state = call.server.state();
        state
            .motion
            .as_ref()
            .filter(|id| {
                state
                    .calls
                    .get(*id)
                    .is_some_and(|c| c.tool == "navigate_to")
            })
            .cloned()
    };
    match navigating {
        Some(_) => {
            let cancelled = call.server.cancel_motion();
            Ok(("completed", Some(json!({ "cancelled": cancelled }))))
        }
        None => {
            let name = controller.cancel_navigation(call.peer.role).await?;
            Ok((
                "completed",
                Some(json!({ "cancelled": [], "location": name })),
            ))
        }
    }
}

/// Resolves once the call is cancelled (a `watch::Ref` is not `Send`, so
/// it must not outlive this function).
async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        // The call's entry is gone: nobody can cancel it any more.
        std::future::pending::<()>().await;
    }
}

enum Prepared {
    Drive(DriveArgs),
    Navigate(Location),
    Save(String),
    None,
}

impl ArpServer {
    /// Cancels the running motion call, if any; its id.
    fn cancel_motion(&self) -> Vec<String> {
        let state = self.state();
        let Some(id) = state.motion.clone() else {
            return Vec::new();
        };
        if let Some(call) = state.calls.get(&id) {
            call.cancel.send_replace(true);
        }
        vec![id]
    }
}

impl Call {
    fn progress(&self, progress: f64, message: &str) {
        self.link.offer(notification(
            method::TOOL_PROGRESS,
            json!({
                "callId": self.id,
                "progress": progress.clamp(0.0, 1.0),
                "message": message,
                "state": "running",
            }),
        ));
    }

    /// Velocity limit (reject or clamp) and the workspace along the path.
    fn check_drive(&self, mut d: DriveArgs) -> Result<DriveArgs, ArpError> {
        let limits = self.server.limits();
        let over = d.linear.abs() > limits.max_linear || d.angular.abs() > limits.max_angular;
        if over {
            match self.server.inner.options.velocity_violation {
                ViolationAction::Reject => {
                    return Err(ArpError::Violation {
                        constraint: "velocity_limit".into(),
                        message: format!(
                            "{} m/s, {} rad/s exceeds the limit of {} m/s, {} rad/s",
                            d.linear, d.angular, limits.max_linear, limits.max_angular
                        ),
                        requested: json!({ "linear": d.linear, "angular": d.angular }),
                        limit: json!({ "max_linear": limits.max_linear, "max_angular": limits.max_angular }),
                    })
                }
                ViolationAction::Clamp => {
                    d.linear = d.linear.clamp(-limits.max_linear, limits.max_linear);
                    d.angular = d.angular.clamp(-limits.max_angular, limits.max_angular);
                }
            }
        }
        let workspace = self.server.state().workspace.clone();
        if let Some(w) = workspace {
            let pose = self.server.pose().ok_or_else(|| {
                ArpError::Precondition(
                    "the pose is unknown, so the workspace cannot be checked".into(),
                )
            })?;
            // The predicted path, sampled: a unicycle at constant velocity.
            let steps = 100;
            let dt = d.duration_secs / f64::from(steps);
            let (mut x, mut y, mut theta) = (pose.x, pose.y, pose.theta);
            let started_inside = w.contains(x, y);
            let mut first_out = None;
            for _ in 0..steps {
                x += d.linear * theta.cos() * dt;
                y += d.linear * theta.sin() * dt;
                theta += d.angular * dt;
                if first_out.is_none() && !w.contains(x, y) {
                    first_out = Some((x, y));
                }
            }
            // Outside already: only a drive that ends inside is allowed.
            let refused = if started_inside {
                first_out
            } else if w.contains(x, y) {
                None
            } else {
                Some((x, y))
            };
            if let Some((x, y)) = refused {
                return Err(ArpError::Violation {
                    constraint: "workspace_bound".into(),
                    message: format!("the drive would leave the workspace at ({x:.2}, {y:.2})"),
                    requested: json!([x, y, 0.0]),
                    limit: w.parameters(),
                });
            }
        }
        Ok(d)
    }

    fn check_navigate(&self, name: &str) -> Result<Location, ArpError> {
        let location = lock(&self.server.shared().locations).get(name).cloned();
        let location = location.ok_or_else(|| ArpError::InvalidParams {
            field: Some("arguments.location".into()),
            message: format!("arguments.location: no saved location {name:?}"),
        })?;
        if let Some(w) = &self.server.state().workspace {
            let (x, y) = (location.position.x, location.position.y);
            if !w.contains(x, y) {
                return Err(ArpError::Violation {
                    constraint: "workspace_bound".into(),
                    message: format!("location {name:?} is outside the workspace"),
                    requested: json!([x, y, location.position.z.unwrap_or(0.0)]),
                    limit: w.parameters(),
                });
            }
        }
        Ok(location)
    }

    /// Asks the caller's human. `Ok(false)`: the call was cancelled
    /// meanwhile.
    async fn confirm(
        &mut self,
        estop: &mut watch::Receiver<Option<String>>,
    ) -> Result<bool, ArpError> {
        if !self.client_confirms {
            // Nobody on this connection answers confirmations: fail closed, at once. (The
            // server's gateway declares it for every program: it asks people, or the
            // program where the robot's policy lets it.)
            tracing::warn!(call = %self.id, tool = self.tool.name, "ARP call needs a confirmation the client does not answer; denied");
            return Err(ArpError::ConfirmationDenied(
                "nobody (the client does not answer confirmations)".into(),
            ));
        }
        let timeout = self.server.inner.options.confirmation_timeout;
        let request_id = self.server.request_id("confirm")?;
        let answer = self
            .link
            .request(
                request_id.clone(),
                method::REQUEST_CONFIRMATION,
                json!({
                    "action": format!("{} {}", self.tool.name, self.arguments),
                    "safetyLevel": self.tool.level.as_str(),
                    "details": { "tool": self.tool.name, "arguments": self.arguments },
                    "timeout": timeout.as_secs_f64(),
                }),
            )
            .await;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        tokio::pin!(answer);
        let mut cancel = self.cancel.clone();
        let outcome = loop {
            tokio::select! {
                biased;
                changed = estop.changed() => {
                    if changed.is_err() {
                        break Err(ArpError::Internal);
                    }
                    if let Some(reason) = estop.borrow_and_update().clone() {
                        break Err(ArpError::EmergencyStopped(reason));
                    }
                }
                _ = cancelled(&mut cancel) => break Ok(false),
                () = &mut deadline => {
                    break Err(ArpError::ConfirmationTimeout(timeout.as_secs_f64()));
                }
                reply = &mut answer => {
                    let reply = reply.unwrap_or(Value::Null);
                    let confirmed = reply.pointer("/result/confirmed").and_then(Value::as_bool) == Some(true);
                    let by = reply
                        .pointer("/result/confirmedBy")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_owned();
                    tracing::warn!(call = %self.id, tool = self.tool.name, confirmed, confirmed_by = %by, "ARP confirmation answered");
                    // Anything but an explicit yes is a no.
                    break if confirmed { Ok(true) } else { Err(ArpError::ConfirmationDenied(by)) };
                }
            }
        };
        self.link.forget(&request_id);
        outcome
    }

    /// Repeats the velocity under the watchdog until the duration ends, the
    /// call is cancelled, or the safety layer refuses (e-stop, rate).
    async fn drive(
        &mut self,
        d: DriveArgs,
        estop: &mut watch::Receiver<Option<String>>,
    ) -> Result<Ended, ArpError> {
        let controller = self.server.shared().controller.clone();
        let limits = self.server.limits();
        let scale = |v: f64, max: f64| if max > 0.0 { v / max } else { 0.0 };
        let forward = scale(d.linear, limits.max_linear);
        let turn = scale(d.angular, limits.max_angular);
        // Three commands per watchdog period: one may be late without the
        // dead-man stopping the robot.
        let period =
            (limits.watchdog / 3).clamp(Duration::from_millis(20), Duration::from_millis(100));
        let total = Duration::from_secs_f64(d.duration_secs);
        let started = Instant::now();
        let end = tokio::time::sleep_until(started + total);
        tokio::pin!(end);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tenths = 0u32;
        let mut cancel = self.cancel.clone();
        let result =
            json!({ "linear": d.linear, "angular": d.angular, "durationSecs": d.duration_secs });
        let ended = loop {
            tokio::select! {
                biased;
                changed = estop.changed() => {
                    if changed.is_err() {
                        break Err(ArpError::Internal);
                    }
                    if let Some(reason) = estop.borrow_and_update().clone() {
                        // The controller has stopped the driver already.
                        return Err(ArpError::EmergencyStopped(reason));
                    }
                }
                _ = cancelled(&mut cancel) => break Ok(("cancelled", Some(result.clone()))),
                () = &mut end => break Ok(("completed", Some(result.clone()))),
                _ = tick.tick() => {
                    if let Err(refusal) = controller.movement(&self.peer.key, self.peer.role, forward, turn).await {
                        break Err(refusal.into());
                    }
                    let done = started.elapsed().as_secs_f64() / total.as_secs_f64();
                    while tenths < 9 && done >= f64::from(tenths + 1) / 10.0 {
                        tenths += 1;
                        self.progress(f64::from(tenths) / 10.0, &format!("driving, {}0 %", tenths));
                    }
                }
            }
        };
        // Halt at once rather than wait for the watchdog; only stops the
        // robot if it still follows this connection.
        controller
            .interrupted(&self.peer.key, StopReason::CallEnded)
            .await;
        ended
    }

    async fn navigate(
        &mut self,
        location: Location,
        estop: &mut watch::Receiver<Option<String>>,
    ) -> Result<Ended, ArpError> {
        let controller = self.server.shared().controller.clone();
        let (tx, mut updates) = mpsc::channel(8);
        lock(&self.link.nav).insert(self.id.clone(), tx);
        let outcome = self
            .navigate_inner(&controller, &location, estop, &mut updates)
            .await;
        lock(&self.link.nav).remove(&self.id);
        outcome
    }

    async fn navigate_inner(
        &mut self,
        controller: &crate::controller::ControllerHandle,
        location: &Location,
        estop: &mut watch::Receiver<Option<String>>,
        updates: &mut mpsc::Receiver<super::connection::NavUpdate>,
    ) -> Result<Ended, ArpError> {
        controller
            .navigate(&self.peer.key, self.peer.role, &self.id, location.clone())
            .await?;
        let goal = (location.position.x, location.position.y);
        let start = self.server.pose();
        let initial = start.map(|p| (goal.0 - p.x).hypot(goal.1 - p.y));
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = json!({ "location": location.name });
        let mut cancel = self.cancel.clone();
        loop {
            tokio::select! {
                biased;
                changed = estop.changed() => {
                    if changed.is_err() {
                        return Err(ArpError::Internal);
                    }
                    if let Some(reason) = estop.borrow_and_update().clone() {
                        return Err(ArpError::EmergencyStopped(reason));
                    }
                }
                _ = cancelled(&mut cancel) => {
                    // Already over (or never accepted) is fine: it stops.
                    if controller.cancel_navigation(self.peer.role).await.is_err() {
                        controller.interrupted(&self.peer.key, StopReason::CallEnded).await;
                    }
                    return Ok(("cancelled", Some(result)));
                }
                update = updates.recv() => {
                    let Some((status, message)) = update else { return Err(ArpError::Internal) };
                    match status {
                        NavigationStatus::Started => self.progress(0.0, "navigation started"),
                        NavigationStatus::Completed => return Ok(("completed", Some(result))),
                        NavigationStatus::Cancelled => return Ok(("cancelled", Some(result))),
                        NavigationStatus::Failed => {
                            if let Some(reason) = estop.borrow().clone() {
                                return Err(ArpError::EmergencyStopped(reason));
                            }
                            return Err(ArpError::ToolFailed(message.unwrap_or_else(|| "navigation failed".into())));
                        }
                    }
                }
                _ = tick.tick() => {
                    if let (Some(initial), Some(p)) = (initial, self.server.pose()) {
                        if initial > 0.0 {
                            let left = (goal.0 - p.x).hypot(goal.1 - p.y);
                            self.progress(1.0 - left / initial, &format!("{left:.2} m to go"));
                        }
                    }
                }
            }
        }
    }

    /// A driver-declared tool: the controller admits it (role, e-stop,
    /// rate), the driver runs it. A cancel or e-stop stops the robot; the
    /// driver's late answer is then ignored.
    async fn driver_tool(
        &mut self,
        estop: &mut watch::Receiver<Option<String>>,
    ) -> Result<Ended, ArpError> {
        let controller = self.server.shared().controller.clone();
        let answer = controller
            .driver_tool(
                &self.peer.key,
                self.peer.role,
                &self.tool.name,
                self.arguments.clone(),
            )
            .await?;
        tokio::pin!(answer);
        let mut cancel = self.cancel.clone();
        loop {
            tokio::select! {
                biased;
                changed = estop.changed() => {
                    if changed.is_err() {
                        return Err(ArpError::Internal);
                    }
                    if let Some(reason) = estop.borrow_and_update().clone() {
                        return Err(ArpError::EmergencyStopped(reason));
                    }
                }
                _ = cancelled(&mut cancel) => {
                    controller.stop_all(StopReason::CallEnded).await;
                    return Ok(("cancelled", None));
                }
                reply = &mut answer => return match reply {
                    Ok(Ok(value)) => {
                        let result = if value.is_object() { value } else { json!({ "value": value }) };
                        Ok(("completed", Some(result)))
                    }
                    Ok(Err(e)) => Err(ArpError::ToolFailed(e.to_string())),
                    Err(_) => Err(ArpError::ToolFailed("the driver went away".into())),
                },
            }
        }
    }

    fn save_location(&self, name: String) -> Result<Ended, ArpError> {
        let pose = self
            .server
            .pose()
            .ok_or_else(|| ArpError::Precondition("the driver reports no pose".into()))?;
        let location = Location {
            name: name.clone(),
            position: Position {
                x: pose.x,
                y: pose.y,
                z: None,
            },
            orientation: Some(Orientation {
                yaw: Some(pose.theta),
                pitch: None,
                roll: None,
            }),
            metadata: None,
        };
        let stored = lock(&self.server.shared().locations).create(location.clone());
        match stored {
            Ok(()) => Ok(("completed", Some(json!({ "location": location })))),
            Err(LocationError::NameInvalid(why)) => Err(ArpError::InvalidParams {
                field: Some("arguments.name".into()),
                message: format!("arguments.name: {why}"),
            }),
            Err(
                e @ (LocationError::AlreadyExists(_)
                | LocationError::StorageFull(_)
                | LocationError::NotFound(_)),
            ) => Err(ArpError::Precondition(e.to_string())),
            Err(e @ LocationError::Storage { .. }) => {
                tracing::error!(error = %e, "cannot persist locations");
                Err(ArpError::Internal)
            }
        }
    }
}
