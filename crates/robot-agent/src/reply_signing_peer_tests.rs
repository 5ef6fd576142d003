//! Signed replies end to end: a webrtc-rs "browser" opens a session with a peer manager
//! whose agent has `sign_replies` on, and every message on its data channel verifies
//! against the robot's key (the hook where messages go out, not only the signer).

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::mpsc;
use webrtc::api::setting_engine::SettingEngine;
use webrtc::api::APIBuilder;
use webrtc::data_channel::data_channel_message::DataChannelMessage;
use webrtc::ice::mdns::MulticastDnsMode;
use webrtc::ice_transport::ice_candidate::RTCIceCandidateInit;
use webrtc::peer_connection::configuration::RTCConfiguration;
use webrtc::peer_connection::sdp::session_description::RTCSessionDescription;

use super::*;
use crate::controller;
use crate::driver::{DriverEvent, DriverHandle};
use crate::identity::KeyType;
use crate::locations::LocationStore;
use crate::peer::{PeerManager, PeerOptions};
use crate::safety::{Role, SafetyLimits};
use crate::session::{Metrics, Shared};
use crate::settings::Settings;
use crate::signalling::Inbound;
use crate::testutil::{validated, WAIT};

async fn next_signal(rx: &mut mpsc::Receiver<Envelope>) -> Envelope {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a signal in time")
        .expect("signalling open")
}

/// The next message on the channel, checked: signed by the robot, and a spec message.
async fn next(messages: &mut mpsc::Receiver<String>, jwk: &Value) -> Envelope {
    let text = tokio::time::timeout(WAIT, messages.recv())
        .await
        .expect("a message in time")
        .expect("channel open");
    let envelope = Envelope::parse(&text).expect("an envelope");
    let header =
        verify(&envelope, jwk).unwrap_or_else(|e| panic!("not signed by the robot: {e}: {text}"));
    assert_eq!(header.kid, "robot-1");
    assert_eq!(header.alg, "ES256");
    validated(&envelope);
    envelope
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_on_the_data_channel_is_signed_when_sign_replies_is_on() {
    let key = RobotKey::generate(KeyType::P256).expect("key");
    let signer = Arc::new(ReplySigner::new(&key, "robot-1").expect("signer"));
    let jwk = signer.jwk();
    let (driver, driver_end) = DriverHandle::channel();
    driver_end
        .events
        .send(DriverEvent::Ready)
        .await
        .expect("ready");
    let limits = SafetyLimits::default();
    let shared = Shared {
        controller: controller::spawn(limits.clone(), driver),
        locations: Arc::new(Mutex::new(LocationStore::in_memory(10))),
        settings: Arc::new(Mutex::new(Settings::defaults(&limits))),
        base_limits: limits,
        metrics: Arc::new(Metrics::default()),
        reply_signer: Some(signer),
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

    // The browser: a control channel, every candidate in its offer.
    let mut settings = SettingEngine::default();
    settings.set_ice_multicast_dns_mode(MulticastDnsMode::Disabled);
    settings.set_include_loopback_candidate(true);
    settings.set_ip_filter(Box::new(|ip: std::net::IpAddr| ip.is_loopback()));
    let api = APIBuilder::new().with_setting_engine(settings).build();
    let browser = Arc::new(
        api.new_peer_connection(RTCConfiguration::default())
            .await
            .expect("pc"),
    );
    let control = browser
        .create_data_channel("control", None)
        .await
        .expect("channel");
    let (msg_tx, mut messages) = mpsc::channel::<String>(16);
    control.on_message(Box::new(move |m: DataChannelMessage| {
        let tx = msg_tx.clone();
        Box::pin(async move {
            let _ = tx.send(String::from_utf8_lossy(&m.data).into_owned()).await;
        })
    }));
    let (open_tx, mut opened) = mpsc::channel::<()>(1);
    control.on_open(Box::new(move || {
        Box::pin(async move {
            let _ = open_tx.send(()).await;
        })
    }));
    let offer = browser.create_offer(None).await.expect("offer");
    let mut gathered = browser.gathering_complete_promise().await;
    browser.set_local_description(offer).await.expect("local");
    let _ = gathered.recv().await;
    let sdp = browser.local_description().await.expect("sdp").sdp;
    in_tx
        .send(Inbound::Offer {
            session: "s1".into(),
            sdp,
            role: Role::Operator,
            subject: Some("alice".into()),
            ticket_expires: None,
        })
        .await
        .expect("offer");

    // The agent's answer and candidates, until it says the session is up.
    let mut candidates = Vec::new();
    let mut answered = false;
    loop {
        let signal = next_signal(&mut sig_rx).await;
        let payload = signal.payload.clone().unwrap_or(Value::Null);
        match signal.kind.as_str() {
            "signalling.answer" => {
                let sdp = payload["sdp"].as_str().expect("sdp").to_owned();
                browser
                    .set_remote_description(RTCSessionDescription::answer(sdp).expect("answer"))
                    .await
                    .expect("remote");
                answered = true;
            }
            "signalling.ice_candidate" => candidates.push(payload),
            "signalling.connected" => break,
            other => panic!("unexpected {other}: {}", signal.to_json()),
        }
        if answered {
            for c in candidates.drain(..) {
                let init = RTCIceCandidateInit {
                    candidate: c["candidate"].as_str().expect("candidate").to_owned(),
                    sdp_mid: c["sdpMid"].as_str().map(str::to_owned),
                    sdp_mline_index: Some(0),
                    username_fragment: None,
                };
                let _ = browser.add_ice_candidate(init).await;
            }
        }
    }
    tokio::time::timeout(WAIT, opened.recv())
        .await
        .expect("the channel opens");

    // The greeting, sent as the channel opens, is signed too.
    assert_eq!(next(&mut messages, &jwk).await.kind, "agent.capabilities");
    for (kind, id) in [("agent.ping", "req-1"), ("agent.location.list", "req-2")] {
        let request = json!({
            "type": kind,
            "version": "0.5",
            "id": id,
            "timestamp": crate::testutil::rfc3339_ms(crate::testutil::client_now_ms()),
        });
        control.send_text(request.to_string()).await.expect("send");
        let reply = next(&mut messages, &jwk).await;
        assert_eq!(reply.correlation_id.as_deref(), Some(id));
    }
    let _ = browser.close().await;
}
