//! A webrtc-rs "browser" (offerer with a `control` channel and a recvonly
//! video transceiver, like the teleop webapp) against the agent's peer
//! manager, on this host. Every message the agent sends is schema-checked.

use std::sync::Arc;

use serde_json::{json, Value};
use signalling_protocol::schema::SchemaValidator;
use tokio::sync::mpsc;
use webrtc::api::media_engine::MediaEngine;
use webrtc::api::setting_engine::SettingEngine;
use webrtc::api::APIBuilder;
use webrtc::data_channel::data_channel_init::RTCDataChannelInit;
use webrtc::data_channel::data_channel_message::DataChannelMessage;
use webrtc::ice::mdns::MulticastDnsMode;
use webrtc::ice_transport::ice_candidate::RTCIceCandidate;
use webrtc::peer_connection::configuration::RTCConfiguration;
use webrtc::peer_connection::sdp::session_description::RTCSessionDescription;
use webrtc::rtp_transceiver::rtp_codec::RTPCodecType;
use webrtc::rtp_transceiver::rtp_transceiver_direction::RTCRtpTransceiverDirection;
use webrtc::rtp_transceiver::RTCRtpTransceiverInit;

use super::*;
use crate::controller;
use crate::driver::{DriverEvent, DriverHandle};
use crate::locations::LocationStore;
use crate::safety::SafetyLimits;
use crate::settings::Settings;
use crate::testutil::WAIT;

fn checked(envelope: &Envelope) -> Value {
    let v: Value = serde_json::from_str(&envelope.to_json()).expect("json");
    if let Err(e) = SchemaValidator::shared().validate(&v) {
        panic!("agent sent a message that breaks the spec: {e}\n{v}");
    }
    v
}

async fn next_signal(
    rx: &mut mpsc::Receiver<Envelope>,
    kind: &str,
    candidates: &mut Vec<Value>,
) -> Value {
    loop {
        let envelope = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {kind} in time"))
            .expect("signalling open");
        let v = checked(&envelope);
        if v["type"] == kind {
            return v;
        }
        assert_eq!(v["type"], "signalling.ice_candidate", "unexpected {v}");
        candidates.push(v);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_a_teleop_style_offer_and_serves_the_control_channel() {
    // The agent side.
    let (driver, end) = DriverHandle::channel();
    end.events.send(DriverEvent::Ready).await.expect("ready");
    let limits = SafetyLimits::default();
    let shared = Shared {
        controller: controller::spawn(limits.clone(), driver),
        locations: Arc::new(std::sync::Mutex::new(LocationStore::in_memory(10))),
        settings: Arc::new(std::sync::Mutex::new(Settings::defaults(&limits))),
        base_limits: limits,
        metrics: Arc::new(crate::session::Metrics::default()),
    };
    let (sig_tx, mut sig_rx) = mpsc::channel(64);
    let manager = PeerManager::new(
        &PeerOptions {
            include_loopback_candidates: true,
            loopback_only: true,
        },
        sig_tx,
        shared,
    )
    .expect("manager");
    let (in_tx, in_rx) = mpsc::channel(64);
    tokio::spawn(manager.run(in_rx));
    in_tx
        .send(Inbound::Online {
            ice_servers: vec![],
        })
        .await
        .expect("online");

    // The browser side.
    let mut media = MediaEngine::default();
    media.register_default_codecs().expect("codecs");
    let mut settings = SettingEngine::default();
    settings.set_ice_multicast_dns_mode(MulticastDnsMode::Disabled);
    settings.set_include_loopback_candidate(true);
    // Loopback only: the test's ICE traffic never leaves 127.0.0.1.
    settings.set_ip_filter(Box::new(|ip: std::net::IpAddr| ip.is_loopback()));
    let api = APIBuilder::new()
        .with_media_engine(media)
        .with_setting_engine(settings)
        .build();
    let browser = Arc::new(
        api.new_peer_connection(RTCConfiguration::default())
            .await
            .expect("pc"),
    );
    let control = browser
        .create_data_channel("control", None)
        .await
        .expect("channel");
    browser
        .add_transceiver_from_kind(
            RTPCodecType::Video,
            Some(RTCRtpTransceiverInit {
                direction: RTCRtpTransceiverDirection::Recvonly,
                send_encodings: vec![],
            }),
        )
        .await
        .expect("video transceiver");
    let (msg_tx, mut msg_rx) = mpsc::channel::<String>(16);
    control.on_message(Box::new(move |m: DataChannelMessage| {
        let tx = msg_tx.clone();
        Box::pin(async move {
            let _ = tx.send(String::from_utf8_lossy(&m.data).into_owned()).await;
        })
    }));
    let (cand_tx, mut cand_rx) = mpsc::channel::<String>(32);
    browser.on_ice_candidate(Box::new(move |c: Option<RTCIceCandidate>| {
        let tx = cand_tx.clone();
        Box::pin(async move {
            if let Some(c) = c {
                if let Ok(init) = c.to_json() {
                    let _ = tx.send(init.candidate).await;
                }
            }
        })
    }));
    let offer = browser.create_offer(None).await.expect("offer");
    browser.set_local_description(offer).await.expect("local");
    let offer_sdp = browser.local_description().await.expect("sdp").sdp;

    in_tx
        .send(Inbound::Offer {
            session: "s-1".into(),
            sdp: offer_sdp,
            role: Role::Operator,
            subject: Some("alice".into()),
        })
        .await
        .expect("offer");
    let mut agent_candidates = Vec::new();
    let answer = next_signal(&mut sig_rx, "signalling.answer", &mut agent_candidates).await;
    assert_eq!(answer["payload"]["connectionId"], "s-1");
    let sdp = answer["payload"]["sdp"].as_str().expect("sdp").to_owned();
    let video = sdp
        .split("m=")
        .find(|m| m.starts_with("video"))
        .expect("video m-line answered");
    assert!(
        video.contains("a=inactive"),
        "video answered inactive without a camera:\n{video}"
    );
    browser
        .set_remote_description(RTCSessionDescription::answer(sdp).expect("answer"))
        .await
        .expect("remote");

    // Trickle both ways until the channel opens and the agent reports it.
    let connected = loop {
        tokio::select! {
            c = cand_rx.recv() => {
                let c = c.expect("browser candidate");
                let payload = IceCandidatePayload {
                    connection_id: "s-1".into(),
                    candidate: c,
                    sdp_mid: "0".into(),
                    sdp_m_line_index: 0,
                    username_fragment: None,
                };
                in_tx.send(Inbound::RemoteCandidate(payload)).await.expect("candidate");
            }
            e = tokio::time::timeout(WAIT, sig_rx.recv()) => {
                let v = checked(&e.expect("agent signal in time").expect("open"));
                match v["type"].as_str() {
                    Some("signalling.ice_candidate") => {
                        assert_eq!(v["payload"]["sdpMid"], "0");
                        let init = RTCIceCandidateInit {
                            candidate: v["payload"]["candidate"].as_str().expect("c").to_owned(),
                            sdp_mid: Some("0".into()),
                            sdp_mline_index: Some(0),
                            username_fragment: None,
                        };
                        browser.add_ice_candidate(init).await.expect("agent candidate");
                    }
                    Some("signalling.connected") => break v,
                    other => panic!("unexpected {other:?}: {v}"),
                }
            }
        }
    };
    for v in agent_candidates {
        let init = RTCIceCandidateInit {
            candidate: v["payload"]["candidate"].as_str().expect("c").to_owned(),
            sdp_mid: Some("0".into()),
            sdp_mline_index: Some(0),
            username_fragment: None,
        };
        let _ = browser.add_ice_candidate(init).await;
    }
    assert_eq!(
        connected["payload"],
        json!({"connectionId": "s-1", "iceConnectionState": "connected", "dataChannelState": "open"})
    );

    // The agent greets with its capabilities, then answers a ping.
    let caps: Value = serde_json::from_str(
        &tokio::time::timeout(WAIT, msg_rx.recv())
            .await
            .expect("caps")
            .expect("msg"),
    )
    .expect("json");
    SchemaValidator::shared()
        .validate(&caps)
        .expect("valid capabilities");
    assert_eq!(caps["type"], "agent.capabilities");
    let ping = json!({"type": "agent.ping", "version": "0.5", "id": "p-1", "timestamp": crate::testutil::rfc3339_ms(crate::testutil::client_now_ms())});
    control
        .send_text(ping.to_string())
        .await
        .expect("send ping");
    let pong: Value = serde_json::from_str(
        &tokio::time::timeout(WAIT, msg_rx.recv())
            .await
            .expect("pong")
            .expect("msg"),
    )
    .expect("json");
    SchemaValidator::shared()
        .validate(&pong)
        .expect("valid pong");
    assert_eq!(pong["correlationId"], "p-1");

    // Movement on a second, unordered, no-retransmit channel (as our SDK
    // sends it) reaches the driver through the same session.
    let motion = browser
        .create_data_channel(
            "motion",
            Some(RTCDataChannelInit {
                ordered: Some(false),
                max_retransmits: Some(0),
                ..Default::default()
            }),
        )
        .await
        .expect("motion channel");
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    motion.on_open(Box::new(move || {
        Box::pin(async move {
            let _ = open_tx.send(()).await;
        })
    }));
    tokio::time::timeout(WAIT, open_rx.recv())
        .await
        .expect("motion channel opens");
    let mut end = end;
    let movement = json!({"type": "agent.movement", "version": "0.5", "id": "m-1",
        "timestamp": crate::testutil::rfc3339_ms(crate::testutil::client_now_ms()),
        "payload": {"forward": 1.0, "turn": 0.0}});
    motion
        .send_text(movement.to_string())
        .await
        .expect("send movement");
    match tokio::time::timeout(WAIT, end.commands.recv())
        .await
        .expect("driver command in time")
        .expect("command")
    {
        crate::driver::DriverCommand::Move { linear, .. } => assert_eq!(linear, 0.5),
        other => panic!("unexpected {other:?}"),
    }
    // Closing that extra channel does not end the session.
    motion.close().await.expect("close motion");
    let ping = json!({"type": "agent.ping", "version": "0.5", "id": "p-2", "timestamp": crate::testutil::rfc3339_ms(crate::testutil::client_now_ms())});
    control
        .send_text(ping.to_string())
        .await
        .expect("send ping");
    let pong: Value = serde_json::from_str(
        &tokio::time::timeout(WAIT, msg_rx.recv())
            .await
            .expect("pong")
            .expect("msg"),
    )
    .expect("json");
    assert_eq!(pong["correlationId"], "p-2");

    // The browser leaves: the agent reports the session closed.
    browser.close().await.expect("close");
    let mut ignored = Vec::new();
    let gone = next_signal(&mut sig_rx, "signalling.disconnected", &mut ignored).await;
    assert_eq!(gone["payload"]["connectionId"], "s-1");
}

#[tokio::test]
async fn a_broken_offer_is_reported_as_failed() {
    let (driver, _end) = DriverHandle::channel();
    let limits = SafetyLimits::default();
    let shared = Shared {
        controller: controller::spawn(limits.clone(), driver),
        locations: Arc::new(std::sync::Mutex::new(LocationStore::in_memory(10))),
        settings: Arc::new(std::sync::Mutex::new(Settings::defaults(&limits))),
        base_limits: limits,
        metrics: Arc::new(crate::session::Metrics::default()),
    };
    let (sig_tx, mut sig_rx) = mpsc::channel(8);
    let manager = PeerManager::new(
        &PeerOptions {
            include_loopback_candidates: true,
            loopback_only: true,
        },
        sig_tx,
        shared,
    )
    .expect("manager");
    let (in_tx, in_rx) = mpsc::channel(8);
    tokio::spawn(manager.run(in_rx));
    in_tx
        .send(Inbound::Offer {
            session: "bad".into(),
            sdp: "not sdp".into(),
            role: Role::Owner,
            subject: None,
        })
        .await
        .expect("offer");
    let mut ignored = Vec::new();
    let failed = next_signal(&mut sig_rx, "signalling.disconnected", &mut ignored).await;
    assert_eq!(failed["payload"]["reason"], "failed");
}
