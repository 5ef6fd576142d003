//! `--driver rosbridge:WS_URL`: publishes `geometry_msgs/Twist` on the
//! configured cmd_vel topic (default `/cmd_vel`) through a rosbridge v2
//! WebSocket, so any ROS 1/ROS 2 base works without ROS on the agent side.
//!
//! Navigation goes over topics too (the spec's `ros.nav_*` keys): goals as
//! `geometry_msgs/PoseStamped` on the goal topic, cancels as `std_msgs/Empty`
//! on the cancel topic, and progress as `std_msgs/String` on the status
//! topic (`started`, `completed`, `cancelled` or `failed`, optionally
//! followed by `: message`). The socket is reconnected with backoff; while it
//! is down the controller holds the robot stopped.

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use signalling_protocol::{NavigationStatus, Orientation, Position};
use tokio_tungstenite::tungstenite::Message;

use super::lines;
use super::{DriverCommand, DriverEnd, DriverError, DriverEvent, DriverOptions, RestartBackoff};

/// Frame of the goal poses; navigation stacks plan in the map frame.
const GOAL_FRAME: &str = "map";

pub async fn run(url: String, mut end: DriverEnd, options: DriverOptions) {
    let mut backoff = RestartBackoff::new(options.restart_initial, options.restart_max);
    loop {
        let reason = match session(&url, &mut end, &options, &mut backoff).await {
            Ok(Gone::Controller) => return,
            Ok(Gone::Socket) => "rosbridge connection closed".to_owned(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(%url, %reason, "rosbridge driver down; reconnecting");
        if !lines::wait_out(&mut end, reason, backoff.next_delay()).await {
            return;
        }
    }
}

enum Gone {
    Controller,
    Socket,
}

async fn session(
    url: &str,
    end: &mut DriverEnd,
    options: &DriverOptions,
    backoff: &mut RestartBackoff,
) -> Result<Gone, DriverError> {
    let (mut ws, _) = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio_tungstenite::connect_async(url),
    )
    .await
    .map_err(|_| DriverError::Timeout)?
    .map_err(|e| DriverError::WebSocket(e.to_string()))?;
    let send = |value: Value| Message::Text(value.to_string().into());
    let setup = setup_messages(options);
    for message in setup {
        ws.send(send(message))
            .await
            .map_err(|e| DriverError::WebSocket(e.to_string()))?;
    }
    tracing::info!(%url, topic = %options.cmd_vel_topic, "rosbridge connected");
    backoff.reset();
    if end.events.send(DriverEvent::Ready).await.is_err() {
        return Ok(Gone::Controller);
    }
    let mut goal: Option<String> = None;
    loop {
        tokio::select! {
            command = end.commands.recv() => {
                let Some(command) = command else {
                    let _ = ws.send(send(twist(&options.cmd_vel_topic, 0.0, 0.0))).await;
                    let _ = ws.close(None).await;
                    return Ok(Gone::Controller);
                };
                let Some((messages, reply)) = command_messages(command, options, &mut goal) else {
                    continue;
                };
                for message in messages {
                    if let Err(e) = ws.send(send(message)).await {
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(DriverError::Unavailable));
                        }
                        return Err(DriverError::WebSocket(e.to_string()));
                    }
                }
                // Topics have no acknowledgement: accepted once published.
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(()));
                }
            }
            frame = ws.next() => {
                let text = match frame {
                    None => return Ok(Gone::Socket),
                    Some(Err(e)) => return Err(DriverError::WebSocket(e.to_string())),
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Close(_))) => return Ok(Gone::Socket),
                    Some(Ok(_)) => continue,
                };
                if let Some(pose) = odometry_pose(&text, &options.odom_topic) {
                    end.pose.send_replace(Some(pose));
                    continue;
                }
                if let Some(event) = status_event(&text, &options.nav_status_topic, &mut goal) {
                    if end.events.send(event).await.is_err() {
                        return Ok(Gone::Controller);
                    }
                }
            }
        }
    }
}

/// What a fresh connection sends: the topics advertised and subscribed, and a stop.
fn setup_messages(options: &DriverOptions) -> [Value; 6] {
    [
        json!({"op": "advertise", "id": "robot-agent-cmd-vel", "topic": options.cmd_vel_topic, "type": "geometry_msgs/Twist"}),
        json!({"op": "advertise", "id": "robot-agent-nav-goal", "topic": options.nav_goal_topic, "type": "geometry_msgs/PoseStamped"}),
        json!({"op": "advertise", "id": "robot-agent-nav-cancel", "topic": options.nav_cancel_topic, "type": "std_msgs/Empty"}),
        json!({"op": "subscribe", "id": "robot-agent-nav-status", "topic": options.nav_status_topic, "type": "std_msgs/String"}),
        // Start from rest whatever the base was doing before we (re)connected.
        twist(&options.cmd_vel_topic, 0.0, 0.0),
        // The pose for ARP's odometry context; 20 Hz is plenty for it.
        json!({"op": "subscribe", "id": "robot-agent-odom", "topic": options.odom_topic, "type": "nav_msgs/Odometry", "throttle_rate": 50}),
    ]
}

/// A command as the messages to publish, and who waits for them to be;
/// `None` for one rosbridge cannot serve (answered here).
fn command_messages(
    command: DriverCommand,
    options: &DriverOptions,
    goal: &mut Option<String>,
) -> Option<(Vec<Value>, Option<super::Reply>)> {
    Some(match command {
        DriverCommand::Move { linear, angular } => {
            (vec![twist(&options.cmd_vel_topic, linear, angular)], None)
        }
        DriverCommand::Stop { .. } => {
            let mut messages = vec![twist(&options.cmd_vel_topic, 0.0, 0.0)];
            if goal.take().is_some() {
                messages.push(empty(&options.nav_cancel_topic));
            }
            (messages, None)
        }
        DriverCommand::Navigate {
            name,
            position,
            orientation,
            reply,
        } => {
            *goal = Some(name);
            let goal = pose(&options.nav_goal_topic, &position, orientation.as_ref());
            (vec![goal], Some(reply))
        }
        DriverCommand::CallTool { reply, .. } => {
            let _ = reply.send(Err(DriverError::Unsupported("tools")));
            return None;
        }
        DriverCommand::CancelNavigation { reply } => {
            *goal = None;
            let messages = vec![
                empty(&options.nav_cancel_topic),
                twist(&options.cmd_vel_topic, 0.0, 0.0),
            ];
            (messages, Some(reply))
        }
    })
}

fn twist(topic: &str, linear: f64, angular: f64) -> Value {
    json!({
        "op": "publish",
        "topic": topic,
        "msg": {
            "linear": {"x": linear, "y": 0.0, "z": 0.0},
            "angular": {"x": 0.0, "y": 0.0, "z": angular},
        },
    })
}

fn empty(topic: &str) -> Value {
    json!({"op": "publish", "topic": topic, "msg": {}})
}

fn pose(topic: &str, position: &Position, orientation: Option<&Orientation>) -> Value {
    let o = orientation.copied().unwrap_or_default();
    let (x, y, z, w) = quaternion(
        o.roll.unwrap_or(0.0),
        o.pitch.unwrap_or(0.0),
        o.yaw.unwrap_or(0.0),
    );
    json!({
        "op": "publish",
        "topic": topic,
        "msg": {
            "header": {"frame_id": GOAL_FRAME},
            "pose": {
                "position": {"x": position.x, "y": position.y, "z": position.z.unwrap_or(0.0)},
                "orientation": {"x": x, "y": y, "z": z, "w": w},
            },
        },
    })
}

/// Roll/pitch/yaw (radians) to a unit quaternion `(x, y, z, w)`.
fn quaternion(roll: f64, pitch: f64, yaw: f64) -> (f64, f64, f64, f64) {
    let (sr, cr) = (roll / 2.0).sin_cos();
    let (sp, cp) = (pitch / 2.0).sin_cos();
    let (sy, cy) = (yaw / 2.0).sin_cos();
    (
        sr * cp * cy - cr * sp * sy,
        cr * sp * cy + sr * cp * sy,
        cr * cp * sy - sr * sp * cy,
        cr * cp * cy + sr * sp * sy,
    )
}

/// The pose in a `nav_msgs/Odometry` message on the odometry topic.
fn odometry_pose(text: &str, topic: &str) -> Option<super::Pose> {
    let msg: Value = serde_json::from_str(text).ok()?;
    if msg.get("op").and_then(Value::as_str) != Some("publish")
        || msg.get("topic").and_then(Value::as_str) != Some(topic)
    {
        return None;
    }
    let pose = msg.pointer("/msg/pose/pose")?;
    let number = |pointer: &str| pose.pointer(pointer).and_then(Value::as_f64);
    let (x, y) = (number("/position/x")?, number("/position/y")?);
    let (qx, qy, qz, qw) = (
        number("/orientation/x").unwrap_or(0.0),
        number("/orientation/y").unwrap_or(0.0),
        number("/orientation/z").unwrap_or(0.0),
        number("/orientation/w").unwrap_or(1.0),
    );
    let theta = (2.0 * (qw * qz + qx * qy)).atan2(1.0 - 2.0 * (qy * qy + qz * qz));
    [x, y, theta]
        .iter()
        .all(|v| v.is_finite())
        .then_some(super::Pose { x, y, theta })
}

/// A navigation event from a status-topic message, for the current goal.
fn status_event(text: &str, status_topic: &str, goal: &mut Option<String>) -> Option<DriverEvent> {
    let msg: Value = serde_json::from_str(text).ok()?;
    if msg.get("op").and_then(Value::as_str) != Some("publish")
        || msg.get("topic").and_then(Value::as_str) != Some(status_topic)
    {
        return None;
    }
    let data = msg.get("msg")?.get("data")?.as_str()?.trim();
    let (word, message) = match data.split_once(':') {
        Some((word, message)) => (word.trim(), Some(message.trim().to_owned())),
        None => (data, None),
    };
    let status = match word.to_ascii_lowercase().as_str() {
        "started" | "active" => NavigationStatus::Started,
        "completed" | "succeeded" | "reached" => NavigationStatus::Completed,
        "cancelled" | "canceled" => NavigationStatus::Cancelled,
        "failed" | "aborted" => NavigationStatus::Failed,
        _ => return None,
    };
    let name = goal.clone()?;
    if status != NavigationStatus::Started {
        *goal = None;
    }
    Some(DriverEvent::Navigation {
        name,
        status,
        message: message.filter(|m| !m.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DriverHandle;
    use crate::testutil::WAIT;
    use tokio::net::TcpListener;
    use tokio::sync::oneshot;

    async fn next_json(
        ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    ) -> Value {
        loop {
            let frame = tokio::time::timeout(WAIT, ws.next())
                .await
                .expect("frame in time")
                .expect("socket open")
                .expect("frame");
            if let Message::Text(text) = frame {
                return serde_json::from_str(&text).expect("JSON");
            }
        }
    }

    /// The handshake: three topics advertised, the status subscribed, a stop
    /// published, odometry subscribed.
    async fn expect_setup(ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>) {
        let advertise = next_json(ws).await;
        assert_eq!(advertise["op"], "advertise");
        assert_eq!(advertise["topic"], "/cmd_vel");
        assert_eq!(advertise["type"], "geometry_msgs/Twist");
        let goal_adv = next_json(ws).await;
        assert_eq!(goal_adv["type"], "geometry_msgs/PoseStamped");
        let cancel_adv = next_json(ws).await;
        assert_eq!(cancel_adv["type"], "std_msgs/Empty");
        let subscribe = next_json(ws).await;
        assert_eq!(subscribe["op"], "subscribe");
        assert_eq!(subscribe["topic"], "/modulr/nav/status");
        let rest = next_json(ws).await;
        assert_eq!(rest["op"], "publish");
        assert_eq!(rest["msg"]["linear"]["x"], 0.0);
        let odom = next_json(ws).await;
        assert_eq!(odom["op"], "subscribe");
        assert_eq!(
            (odom["topic"].as_str(), odom["type"].as_str()),
            (Some("/odom"), Some("nav_msgs/Odometry"))
        );
    }

    /// A navigate published as a goal pose; the status topic ends it.
    async fn navigation_goal_and_status(
        ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
        handle: &mut DriverHandle,
    ) {
        let (reply, accepted) = oneshot::channel();
        handle
            .commands
            .send(DriverCommand::Navigate {
                name: "dock".into(),
                position: Position {
                    x: 1.0,
                    y: 2.0,
                    z: None,
                },
                orientation: Some(Orientation {
                    yaw: Some(std::f64::consts::FRAC_PI_2),
                    pitch: None,
                    roll: None,
                }),
                reply,
            })
            .await
            .expect("send");
        let goal = next_json(ws).await;
        assert_eq!(goal["topic"], "/modulr/nav/goal");
        assert_eq!(goal["msg"]["pose"]["position"]["x"], 1.0);
        let qz = goal["msg"]["pose"]["orientation"]["z"]
            .as_f64()
            .expect("qz");
        assert!((qz - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-9);
        assert!(accepted.await.expect("reply").is_ok());

        ws.send(Message::Text(
            json!({"op":"publish","topic":"/modulr/nav/status","msg":{"data":"completed"}})
                .to_string()
                .into(),
        ))
        .await
        .expect("send status");
        assert_eq!(
            tokio::time::timeout(WAIT, handle.events.recv())
                .await
                .expect("status"),
            Some(DriverEvent::Navigation {
                name: "dock".into(),
                status: NavigationStatus::Completed,
                message: None
            })
        );
    }

    async fn odometry_becomes_the_pose(
        ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
        handle: &DriverHandle,
    ) {
        let mut pose = handle.pose.clone();
        ws.send(Message::Text(
            json!({"op":"publish","topic":"/odom","msg":{"pose":{"pose":{
                "position":{"x":1.5,"y":-2.0,"z":0.0},
                "orientation":{"x":0.0,"y":0.0,"z":std::f64::consts::FRAC_1_SQRT_2,"w":std::f64::consts::FRAC_1_SQRT_2}}}}})
                .to_string()
                .into(),
        ))
        .await
        .expect("send odometry");
        tokio::time::timeout(WAIT, pose.wait_for(Option::is_some))
            .await
            .expect("pose in time")
            .expect("driver alive");
        let p = pose.borrow().expect("pose");
        assert_eq!((p.x, p.y), (1.5, -2.0));
        assert!((p.theta - std::f64::consts::FRAC_PI_2).abs() < 1e-9);
    }

    /// A fake rosbridge server: asserts the advertise/subscribe handshake,
    /// then the Twist publications, and feeds back a navigation status.
    #[tokio::test]
    async fn advertises_and_publishes_twist_on_cmd_vel() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("ws://{}", listener.local_addr().expect("addr"));
        let (mut handle, end) = DriverHandle::channel();
        tokio::spawn(run(url, end, DriverOptions::default()));

        let (tcp, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .expect("agent connects")
            .expect("accept");
        let mut ws = tokio_tungstenite::accept_async(tcp).await.expect("upgrade");

        expect_setup(&mut ws).await;

        assert_eq!(
            tokio::time::timeout(WAIT, handle.events.recv())
                .await
                .expect("ready"),
            Some(DriverEvent::Ready)
        );
        handle
            .commands
            .send(DriverCommand::Move {
                linear: 0.4,
                angular: -0.2,
            })
            .await
            .expect("send");
        let publish = next_json(&mut ws).await;
        assert_eq!(
            publish,
            json!({"op":"publish","topic":"/cmd_vel","msg":{
                "linear":{"x":0.4,"y":0.0,"z":0.0},"angular":{"x":0.0,"y":0.0,"z":-0.2}}})
        );

        navigation_goal_and_status(&mut ws, &mut handle).await;

        // Odometry becomes the pose ARP reports.
        odometry_becomes_the_pose(&mut ws, &handle).await;

        // The server goes away: the driver reports it and reconnects.
        drop(ws);
        assert!(matches!(
            tokio::time::timeout(WAIT, handle.events.recv())
                .await
                .expect("down"),
            Some(DriverEvent::Unavailable { .. })
        ));
        let (tcp, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .expect("agent reconnects")
            .expect("accept");
        let mut ws = tokio_tungstenite::accept_async(tcp).await.expect("upgrade");
        assert_eq!(next_json(&mut ws).await["op"], "advertise");
    }

    #[test]
    fn status_strings() {
        let mut goal = Some("dock".to_owned());
        let msg = |data: &str| json!({"op":"publish","topic":"/s","msg":{"data":data}}).to_string();
        assert_eq!(
            status_event(&msg("failed: blocked"), "/s", &mut goal),
            Some(DriverEvent::Navigation {
                name: "dock".into(),
                status: NavigationStatus::Failed,
                message: Some("blocked".into())
            })
        );
        assert_eq!(goal, None);
        assert_eq!(status_event(&msg("completed"), "/s", &mut goal), None);
        let mut goal = Some("dock".to_owned());
        assert_eq!(status_event(&msg("bogus"), "/s", &mut goal), None);
        assert_eq!(status_event(&msg("completed"), "/other", &mut goal), None);
    }
}
