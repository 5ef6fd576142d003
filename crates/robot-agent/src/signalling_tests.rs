//! The signalling client against a scripted server on 127.0.0.1:0. Every
//! message the agent sends is validated against the spec.

use serde_json::json;
use tokio::net::TcpListener;

use super::*;
use crate::testutil::scripted::{self, accept, next_text as recv, Socket as Server};
use crate::testutil::WAIT;

fn server_message(kind: &str, payload: Option<Value>, correlation: Option<&str>) -> Message {
    let mut m = scripted::envelope(kind, payload.unwrap_or(Value::Null));
    if let Some(c) = correlation {
        m["correlationId"] = json!(c);
    }
    Message::Text(m.to_string().into())
}

/// welcome → register → challenge → response (verified here) → verified.
async fn login(ws: &mut Server, key: &RobotKey) {
    ws.send(server_message(
        "signalling.welcome",
        Some(json!({"connectionId": "c1", "iceServers": []})),
        None,
    ))
    .await
    .expect("send");
    scripted::login(ws, "robot-1", Some(key)).await;
}

/// Accepts the client's socket and logs it in; it is online, without ICE servers.
async fn logged_in(
    listener: &TcpListener,
    key: &RobotKey,
    in_rx: &mut mpsc::Receiver<Inbound>,
) -> Server {
    let mut ws = accept(listener).await;
    login(&mut ws, key).await;
    assert_eq!(
        next_inbound(in_rx).await,
        Inbound::Online {
            ice_servers: vec![]
        }
    );
    ws
}

/// A welcome carrying a TURN server with credentials.
async fn send_turn_welcome(ws: &mut Server) {
    ws.send(server_message(
        "signalling.welcome",
        Some(json!({"connectionId": "c1", "iceServers": [{"urls": ["turn:127.0.0.1:3478"], "username": "u", "credential": "p"}]})),
        None,
    ))
    .await
    .expect("send");
}

/// Starts the client with `options`: its key, the sender of what it sends
/// the server, the receiver of what it tells the peer manager.
fn start(
    options: SignallingOptions,
) -> (
    Arc<RobotKey>,
    mpsc::Sender<Envelope>,
    mpsc::Receiver<Inbound>,
) {
    let key = options.key.clone();
    let (in_tx, in_rx) = mpsc::channel(16);
    (key, spawn(options, in_tx), in_rx)
}

async fn next_inbound(rx: &mut mpsc::Receiver<Inbound>) -> Inbound {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("event in time")
        .expect("event")
}

#[test]
fn backoff_grows_with_jitter_and_is_capped() {
    let config = ReconnectConfig {
        initial_delay_ms: 100,
        max_delay_ms: 1000,
    };
    assert_eq!(backoff_delay(&config, 0, 0.0), Duration::from_millis(50));
    assert_eq!(backoff_delay(&config, 0, 1.0), Duration::from_millis(100));
    assert_eq!(backoff_delay(&config, 2, 1.0), Duration::from_millis(400));
    assert_eq!(backoff_delay(&config, 10, 0.0), Duration::from_millis(500));
    assert_eq!(backoff_delay(&config, 10, 1.0), Duration::from_millis(1000));
    let r = random_unit();
    assert!((0.0..1.0).contains(&r));
}

#[test]
fn several_servers_are_tried_in_turn_with_jitter_then_backoff() {
    let config = ReconnectConfig {
        initial_delay_ms: 100,
        max_delay_ms: 1000,
    };
    let urls: Vec<String> = ["ws://a/ws", "ws://b/ws", "ws://c/ws"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    // After a verified connection to b dropped: b again first, then c, a.
    let order: Vec<&str> = (0..5).map(|f| server_for(&urls, 1, f)).collect();
    assert_eq!(
        order,
        vec![
            "ws://b/ws",
            "ws://c/ws",
            "ws://a/ws",
            "ws://b/ws",
            "ws://c/ws"
        ]
    );
    // A reconnect after a drop backs off as before.
    assert_eq!(
        reconnect_delay(&config, 0, 3, 1.0),
        Duration::from_millis(100)
    );
    // Within a round, the next server follows after a jittered moment...
    assert_eq!(reconnect_delay(&config, 1, 3, 0.0), Duration::ZERO);
    assert_eq!(
        reconnect_delay(&config, 2, 3, 0.5),
        Duration::from_millis(50)
    );
    // ...and once every server failed, the round backs off exponentially.
    assert_eq!(
        reconnect_delay(&config, 3, 3, 1.0),
        Duration::from_millis(100)
    );
    assert_eq!(
        reconnect_delay(&config, 6, 3, 1.0),
        Duration::from_millis(200)
    );
    assert_eq!(
        reconnect_delay(&config, 60, 3, 1.0),
        Duration::from_millis(1000)
    );
    // One server: every failure is a full round.
    assert_eq!(
        reconnect_delay(&config, 1, 1, 1.0),
        Duration::from_millis(100)
    );
    assert_eq!(
        reconnect_delay(&config, 2, 1, 1.0),
        Duration::from_millis(200)
    );
}

#[tokio::test]
async fn an_unreachable_server_is_skipped_for_the_next_one() {
    // The first URL refuses connections (a port just released), the second
    // is a working server: the robot registers there.
    let dead = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead_url = format!("ws://{}/ws", dead.local_addr().expect("addr"));
    drop(dead);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let mut options = scripted::options(&listener, "robot-1");
    options.urls.insert(0, dead_url);
    options.arp = false;
    let (in_tx, _in_rx) = mpsc::channel(16);
    let _out = spawn(options, in_tx);
    let mut ws = accept(&listener).await;
    let register = recv(&mut ws).await;
    assert_eq!(register["type"], "signalling.register");
}

/// An offer carries the session's role from meta.session; none means viewer.
async fn offers_carry_the_sessions_role(ws: &mut Server, in_rx: &mut mpsc::Receiver<Inbound>) {
    let mut offer = json!({
        "type": "signalling.offer", "version": "0.5", "id": "o1", "timestamp": "2026-01-06T12:00:00Z",
        "payload": {"robotId": "robot-1", "connectionId": "sess-1", "sdpType": "offer", "sdp": "v=0\r\n"},
        "meta": {"session": {"subject": "alice", "role": "operator"}},
    });
    ws.send(Message::Text(offer.to_string().into()))
        .await
        .expect("send");
    assert_eq!(
        next_inbound(in_rx).await,
        Inbound::Offer {
            session: "sess-1".into(),
            sdp: "v=0\r\n".into(),
            role: Role::Operator,
            subject: Some("alice".into()),
            ticket_expires: None,
        }
    );
    offer["meta"] = json!({});
    ws.send(Message::Text(offer.to_string().into()))
        .await
        .expect("send");
    match next_inbound(in_rx).await {
        Inbound::Offer { role, .. } => assert_eq!(role, Role::Viewer, "no role means viewer"),
        other => panic!("unexpected {other:?}"),
    }
}

/// Candidates and a session's end reach the peer manager.
async fn candidates_and_ends_are_relayed(ws: &mut Server, in_rx: &mut mpsc::Receiver<Inbound>) {
    ws.send(server_message(
        "signalling.ice_candidate",
        Some(json!({"connectionId": "sess-1", "candidate": "candidate:1 1 udp 1 127.0.0.1 9 typ host", "sdpMid": "0", "sdpMLineIndex": 0})),
        None,
    ))
    .await
    .expect("send");
    assert!(
        matches!(next_inbound(in_rx).await, Inbound::RemoteCandidate(c) if c.connection_id == "sess-1")
    );
    ws.send(server_message(
        "signalling.disconnected",
        Some(json!({"connectionId": "sess-1", "reason": "closed"})),
        None,
    ))
    .await
    .expect("send");
    assert_eq!(
        next_inbound(in_rx).await,
        Inbound::Disconnected {
            session: "sess-1".into()
        }
    );
}

#[tokio::test]
async fn registers_relays_and_reregisters_after_reconnect() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let options = SignallingOptions {
        certificate: Some("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n".into()),
        arp: false,
        ..scripted::options(&listener, "robot-1")
    };
    let (key, out, mut in_rx) = start(options);

    let mut ws = logged_in(&listener, &key, &mut in_rx).await;
    // The TURN-bearing second welcome updates the ICE servers.
    send_turn_welcome(&mut ws).await;
    match next_inbound(&mut in_rx).await {
        Inbound::IceServers(servers) => assert_eq!(servers[0].username.as_deref(), Some("u")),
        other => panic!("unexpected {other:?}"),
    }

    offers_carry_the_sessions_role(&mut ws, &mut in_rx).await;
    candidates_and_ends_are_relayed(&mut ws, &mut in_rx).await;

    // Server pings are answered; outbound messages are relayed.
    ws.send(server_message("signalling.ping", None, None))
        .await
        .expect("send");
    assert_eq!(recv(&mut ws).await["type"], "signalling.pong");
    let answer = Envelope::from_body(
        Signalling::Disconnected(signalling_protocol::DisconnectedPayload {
            connection_id: "sess-1".into(),
            reason: signalling_protocol::DisconnectReason::Closed,
            ice_connection_state: None,
            details: None,
        }),
        PROTOCOL_VERSION,
    );
    out.send(answer).await.expect("queue");
    assert_eq!(recv(&mut ws).await["type"], "signalling.disconnected");

    // The server goes away: offline, then a fresh login on the new socket.
    drop(ws);
    assert_eq!(next_inbound(&mut in_rx).await, Inbound::Offline);
    logged_in(&listener, &key, &mut in_rx).await;
}

#[tokio::test]
async fn refused_logins_are_retried() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let options = SignallingOptions {
        reconnect: ReconnectConfig {
            initial_delay_ms: 10,
            max_delay_ms: 20,
        },
        arp: false,
        ..scripted::options(&listener, "robot-1")
    };
    let (key, _out, mut in_rx) = start(options);
    let mut ws = accept(&listener).await;
    ws.send(server_message(
        "signalling.welcome",
        Some(json!({"connectionId": "c1"})),
        None,
    ))
    .await
    .expect("send");
    let register = recv(&mut ws).await;
    assert!(register["payload"]["metadata"].get("certificate").is_none());
    assert_eq!(register["payload"]["metadata"]["wantsWelcome"], true);
    assert!(
        register["payload"]["metadata"].get("arp").is_none(),
        "no ARP declared when the agent serves none"
    );
    ws.send(server_message(
        "signalling.error",
        Some(json!({"code": "UNAUTHORIZED", "message": "unknown robot"})),
        register["id"].as_str(),
    ))
    .await
    .expect("send");
    // It comes back and logs in properly.
    let mut ws = accept(&listener).await;
    login(&mut ws, &key).await;
    assert!(matches!(
        next_inbound(&mut in_rx).await,
        Inbound::Online { .. }
    ));
}

/// A server that greets token-less sockets only when asked: the agent
/// registers without waiting for a welcome, declares it wants one (merged
/// with its certificate chain), and takes the TURN servers of the welcome
/// that follows `pki_verified`.
#[tokio::test]
async fn registers_without_a_welcome_and_asks_for_one() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let options = SignallingOptions {
        certificate: Some("-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n".into()),
        reconnect: ReconnectConfig {
            initial_delay_ms: 10,
            max_delay_ms: 20,
        },
        arp: false,
        ..scripted::options(&listener, "robot-1")
    };
    let (_key, _out, mut in_rx) = start(options);
    let mut ws = accept(&listener).await;
    // No welcome is sent: the register comes anyway.
    let register = recv(&mut ws).await;
    assert_eq!(register["type"], "signalling.register");
    let metadata = &register["payload"]["metadata"];
    assert_eq!(metadata["wantsWelcome"], true);
    assert!(metadata["certificate"]
        .as_str()
        .is_some_and(|c| c.contains("BEGIN CERTIFICATE")));
    let challenge = server_message(
        "signalling.pki_challenge",
        Some(json!({"challenge": STANDARD.encode([1u8; 32])})),
        None,
    );
    ws.send(challenge).await.expect("send");
    let response = recv(&mut ws).await;
    assert_eq!(response["type"], "signalling.pki_response");
    ws.send(server_message(
        "signalling.pki_verified",
        Some(json!({"agentId": "robot-1"})),
        response["id"].as_str(),
    ))
    .await
    .expect("send");
    send_turn_welcome(&mut ws).await;
    assert_eq!(
        next_inbound(&mut in_rx).await,
        Inbound::Online {
            ice_servers: vec![]
        }
    );
    match next_inbound(&mut in_rx).await {
        Inbound::IceServers(servers) => {
            assert_eq!(servers[0].urls, vec!["turn:127.0.0.1:3478".to_owned()]);
            assert_eq!(servers[0].credential.as_deref(), Some("p"));
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// An older server's welcome at open, even one arriving between the
/// register and the challenge, is still used.
#[tokio::test]
async fn a_welcome_at_open_is_still_used() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let options = SignallingOptions {
        reconnect: ReconnectConfig::default(),
        arp: false,
        ..scripted::options(&listener, "robot-1")
    };
    let (_key, _out, mut in_rx) = start(options);
    let mut ws = accept(&listener).await;
    let register = recv(&mut ws).await;
    assert_eq!(register["type"], "signalling.register");
    ws.send(server_message(
        "signalling.welcome",
        Some(json!({"connectionId": "c1", "iceServers": [{"urls": ["stun:127.0.0.1:3478"]}]})),
        None,
    ))
    .await
    .expect("send");
    ws.send(server_message(
        "signalling.pki_challenge",
        Some(json!({"challenge": STANDARD.encode([2u8; 32])})),
        None,
    ))
    .await
    .expect("send");
    let response = recv(&mut ws).await;
    ws.send(server_message(
        "signalling.pki_verified",
        Some(json!({"agentId": "robot-1"})),
        response["id"].as_str(),
    ))
    .await
    .expect("send");
    match next_inbound(&mut in_rx).await {
        Inbound::Online { ice_servers } => {
            assert_eq!(ice_servers[0].urls, vec!["stun:127.0.0.1:3478".to_owned()]);
        }
        other => panic!("unexpected {other:?}"),
    }
}
