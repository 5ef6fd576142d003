//! A browser's side of a WebRTC session (webrtc-rs, loopback only) and the
//! agent's peer manager it talks to, fed by hand instead of a signalling
//! client.

use std::sync::Arc;

use serde_json::Value;
use signalling_protocol::Envelope;
use tokio::sync::mpsc;
use webrtc::api::media_engine::MediaEngine;
use webrtc::api::setting_engine::SettingEngine;
use webrtc::api::APIBuilder;
use webrtc::data_channel::data_channel_message::DataChannelMessage;
use webrtc::data_channel::RTCDataChannel;
use webrtc::ice::mdns::MulticastDnsMode;
use webrtc::ice_transport::ice_candidate::{RTCIceCandidate, RTCIceCandidateInit};
use webrtc::peer_connection::configuration::RTCConfiguration;
use webrtc::peer_connection::sdp::session_description::RTCSessionDescription;
use webrtc::peer_connection::RTCPeerConnection;
use webrtc::rtp_transceiver::rtp_codec::RTPCodecType;
use webrtc::rtp_transceiver::rtp_transceiver_direction::RTCRtpTransceiverDirection;
use webrtc::rtp_transceiver::RTCRtpTransceiverInit;

use super::{validated, WAIT};
use crate::controller::{self, ControllerHandle};
use crate::driver::{DriverEnd, DriverEvent, DriverHandle};
use crate::peer::{PeerManager, PeerOptions};
use crate::safety::{Role, SafetyLimits};
use crate::signalling::Inbound;

/// The agent's ICE settings in tests: loopback candidates only, so no test
/// traffic leaves 127.0.0.1.
pub fn loopback() -> PeerOptions {
    PeerOptions {
        include_loopback_candidates: true,
        loopback_only: true,
    }
}

/// A controller over a driver that said it is ready; the driver's end is
/// returned so the test holds it (and can read its commands).
pub async fn ready_controller() -> (ControllerHandle, DriverEnd) {
    let (driver, end) = DriverHandle::channel();
    end.events.send(DriverEvent::Ready).await.expect("ready");
    (controller::spawn(SafetyLimits::default(), driver), end)
}

/// Runs `manager` (made by `build` around its signalling sender); returns
/// what the signalling client would hold: the sender of what the server
/// tells the agent, and the receiver of what the agent sends the server.
pub fn spawn_manager(
    capacity: usize,
    build: impl FnOnce(mpsc::Sender<Envelope>) -> PeerManager,
) -> (mpsc::Sender<Inbound>, mpsc::Receiver<Envelope>) {
    let (sig_tx, sig_rx) = mpsc::channel(capacity);
    let manager = build(sig_tx);
    let (in_tx, in_rx) = mpsc::channel(capacity);
    tokio::spawn(manager.run(in_rx));
    (in_tx, sig_rx)
}

/// The signalling client came online, without ICE servers.
pub async fn online(in_tx: &mpsc::Sender<Inbound>) {
    in_tx
        .send(Inbound::Online {
            ice_servers: vec![],
        })
        .await
        .expect("online");
}

/// The agent's next signal.
pub async fn next_envelope(sig_rx: &mut mpsc::Receiver<Envelope>) -> Envelope {
    tokio::time::timeout(WAIT, sig_rx.recv())
        .await
        .expect("a signal in time")
        .expect("signalling open")
}

/// The agent's next signal of `kind`, schema-checked; ICE candidates before
/// it are kept in `candidates`, anything else fails the test.
pub async fn next_signal(
    sig_rx: &mut mpsc::Receiver<Envelope>,
    kind: &str,
    candidates: &mut Vec<Value>,
) -> Value {
    loop {
        let v = validated(&next_envelope(sig_rx).await);
        if v["type"] == kind {
            return v;
        }
        assert_eq!(v["type"], "signalling.ice_candidate", "unexpected {v}");
        candidates.push(v);
    }
}

/// A browser's peer connection: default codecs, no mDNS, loopback
/// candidates only.
pub async fn browser() -> Arc<RTCPeerConnection> {
    let mut settings = SettingEngine::default();
    settings.set_ice_multicast_dns_mode(MulticastDnsMode::Disabled);
    settings.set_include_loopback_candidate(true);
    settings.set_ip_filter(Box::new(|ip: std::net::IpAddr| ip.is_loopback()));
    let mut media = MediaEngine::default();
    media.register_default_codecs().expect("codecs");
    let api = APIBuilder::new()
        .with_media_engine(media)
        .with_setting_engine(settings)
        .build();
    Arc::new(
        api.new_peer_connection(RTCConfiguration::default())
            .await
            .expect("pc"),
    )
}

/// A browser like the teleop web app: a `control` channel and one recvonly
/// video transceiver.
pub async fn teleop_browser() -> (Arc<RTCPeerConnection>, Arc<RTCDataChannel>) {
    let pc = browser().await;
    let control = pc
        .create_data_channel("control", None)
        .await
        .expect("channel");
    pc.add_transceiver_from_kind(
        RTPCodecType::Video,
        Some(RTCRtpTransceiverInit {
            direction: RTCRtpTransceiverDirection::Recvonly,
            send_encodings: vec![],
        }),
    )
    .await
    .expect("video transceiver");
    (pc, control)
}

/// A browser whose offer opens one data channel per label, and that offer.
pub async fn offer_sdp(labels: &[&str]) -> (Arc<RTCPeerConnection>, String) {
    let pc = browser().await;
    for label in labels {
        pc.create_data_channel(label, None).await.expect("channel");
    }
    let sdp = local_offer(&pc).await;
    (pc, sdp)
}

/// Makes `pc`'s offer its local description and returns its SDP.
pub async fn local_offer(pc: &RTCPeerConnection) -> String {
    let offer = pc.create_offer(None).await.expect("offer");
    pc.set_local_description(offer).await.expect("local");
    pc.local_description().await.expect("sdp").sdp
}

/// Every text message that arrives on `channel`.
pub fn messages(channel: &RTCDataChannel, capacity: usize) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel::<String>(capacity);
    channel.on_message(Box::new(move |m: DataChannelMessage| {
        let tx = tx.clone();
        Box::pin(async move {
            let _ = tx.send(String::from_utf8_lossy(&m.data).into_owned()).await;
        })
    }));
    rx
}

/// Receives once when `channel` opens.
pub fn opened(channel: &RTCDataChannel) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel::<()>(1);
    channel.on_open(Box::new(move || {
        Box::pin(async move {
            let _ = tx.send(()).await;
        })
    }));
    rx
}

/// `pc`'s offer with every candidate in it (gathering waited for).
pub async fn complete_offer(pc: &RTCPeerConnection) -> String {
    let offer = pc.create_offer(None).await.expect("offer");
    let mut gathered = pc.gathering_complete_promise().await;
    pc.set_local_description(offer).await.expect("local");
    let _ = gathered.recv().await;
    pc.local_description().await.expect("sdp").sdp
}

/// An offer for `session` from `subject` in `role`, as the signalling
/// client hands it over (no ticket).
pub async fn send_offer(
    in_tx: &mpsc::Sender<Inbound>,
    session: &str,
    sdp: String,
    role: Role,
    subject: &str,
) {
    in_tx
        .send(Inbound::Offer {
            session: session.into(),
            sdp,
            role,
            subject: Some(subject.into()),
            ticket_expires: None,
        })
        .await
        .expect("offer");
}

/// Applies the agent's answer to `pc`, then its trickled candidates, until
/// the agent reports the session connected (a browser whose offer carried
/// all of its candidates). Returns the answer's SDP and the `connected`.
pub async fn connect(
    pc: &RTCPeerConnection,
    sig_rx: &mut mpsc::Receiver<Envelope>,
) -> (String, Value) {
    let mut answering = Answering::default();
    loop {
        let v = validated(&next_envelope(sig_rx).await);
        if let Some(connected) = answering.signal(pc, v).await {
            return (
                answering.sdp.expect("an answer before connected"),
                connected,
            );
        }
    }
}

/// As [`connect`], until `opened` says the browser's channel is open (an
/// `arp`-only session is never reported connected).
pub async fn connect_until_open(
    pc: &RTCPeerConnection,
    sig_rx: &mut mpsc::Receiver<Envelope>,
    opened: &mut mpsc::Receiver<()>,
) {
    let mut answering = Answering::default();
    loop {
        tokio::select! {
            e = next_envelope(sig_rx) => {
                answering.signal(pc, validated(&e)).await;
            }
            o = tokio::time::timeout(WAIT, opened.recv()) => {
                o.expect("the channel opens in time");
                return;
            }
        }
    }
}

/// The browser's side of the agent's answer and trickled candidates.
#[derive(Default)]
struct Answering {
    sdp: Option<String>,
    candidates: Vec<Value>,
}

impl Answering {
    /// Applies one signal; returns it when it is `signalling.connected`.
    async fn signal(&mut self, pc: &RTCPeerConnection, v: Value) -> Option<Value> {
        match v["type"].as_str() {
            Some("signalling.answer") => {
                let sdp = v["payload"]["sdp"].as_str().expect("sdp").to_owned();
                pc.set_remote_description(
                    RTCSessionDescription::answer(sdp.clone()).expect("answer"),
                )
                .await
                .expect("remote");
                self.sdp = Some(sdp);
            }
            Some("signalling.ice_candidate") => self.candidates.push(v),
            Some("signalling.connected") => return Some(v),
            other => panic!("unexpected {other:?}: {v}"),
        }
        if self.sdp.is_some() {
            for c in self.candidates.drain(..) {
                let _ = pc.add_ice_candidate(candidate_init(&c)).await;
            }
        }
        None
    }
}

/// The agent's `signalling.ice_candidate` as the browser takes it.
pub fn candidate_init(signal: &Value) -> RTCIceCandidateInit {
    RTCIceCandidateInit {
        candidate: signal["payload"]["candidate"]
            .as_str()
            .expect("candidate")
            .to_owned(),
        sdp_mid: signal["payload"]["sdpMid"].as_str().map(str::to_owned),
        sdp_mline_index: Some(0),
        username_fragment: None,
    }
}

/// `pc`'s own ICE candidates as it gathers them (for a trickling browser).
pub fn local_candidates(pc: &RTCPeerConnection) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel::<String>(32);
    pc.on_ice_candidate(Box::new(move |c: Option<RTCIceCandidate>| {
        let tx = tx.clone();
        Box::pin(async move {
            if let Some(Ok(init)) = c.map(|c| c.to_json()) {
                let _ = tx.send(init.candidate).await;
            }
        })
    }));
    rx
}
