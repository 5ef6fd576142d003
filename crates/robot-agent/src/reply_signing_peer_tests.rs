//! Signed replies end to end: a webrtc-rs "browser" opens a session with a peer manager
//! whose agent has `sign_replies` on, and every message on its data channel verifies
//! against the robot's key (the hook where messages go out, not only the signer).

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::*;
use crate::controller;
use crate::driver::{DriverEvent, DriverHandle};
use crate::identity::KeyType;
use crate::peer::PeerManager;
use crate::safety::{Role, SafetyLimits};
use crate::testutil::browser::{
    browser, complete_offer, connect, loopback, messages, online, opened, send_offer, spawn_manager,
};
use crate::testutil::{self, validated, WAIT};

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
    let shared = testutil::shared(
        controller::spawn(SafetyLimits::default(), driver),
        Some(signer),
    );
    let (in_tx, mut sig_rx) = spawn_manager(64, |sig_tx| {
        PeerManager::new(&loopback(), sig_tx, shared).expect("manager")
    });
    online(&in_tx).await;

    // The browser: a control channel, every candidate in its offer.
    let browser = browser().await;
    let control = browser
        .create_data_channel("control", None)
        .await
        .expect("channel");
    let mut messages = messages(&control, 16);
    let mut opened = opened(&control);
    let sdp = complete_offer(&browser).await;
    send_offer(&in_tx, "s1", sdp, Role::Operator, "alice").await;
    // The agent's answer and candidates, until it says the session is up.
    connect(&browser, &mut sig_rx).await;
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
