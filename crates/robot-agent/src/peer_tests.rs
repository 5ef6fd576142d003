//! A webrtc-rs "browser" (offerer with a `control` channel and a recvonly
//! video transceiver, like the teleop webapp) against the agent's peer
//! manager, on this host. Every message the agent sends is schema-checked.

use std::sync::Arc;

use serde_json::{json, Value};
use signalling_protocol::schema::SchemaValidator;
use tokio::sync::mpsc;
use webrtc::data_channel::data_channel_init::RTCDataChannelInit;
use webrtc::peer_connection::sdp::session_description::RTCSessionDescription;

use super::*;
use crate::controller;
use crate::driver::{DriverEvent, DriverHandle};
use crate::safety::SafetyLimits;
use crate::testutil::browser::{
    browser, candidate_init, complete_offer, connect, connect_until_open, local_candidates,
    local_offer, loopback, messages, next_signal, offer_sdp, online, opened, ready_controller,
    send_offer, spawn_manager, teleop_browser,
};
use crate::testutil::{self, validated, WAIT};
use crate::video::{Camera, CameraStats, VideoSpec};

/// Opens an unordered, no-retransmit `motion` channel, sends a movement on
/// it and checks that it reached the driver; returns the channel.
async fn move_on_a_motion_channel(
    browser: &RTCPeerConnection,
    end: &mut crate::driver::DriverEnd,
) -> Arc<RTCDataChannel> {
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
    let mut open_rx = opened(&motion);
    tokio::time::timeout(WAIT, open_rx.recv())
        .await
        .expect("motion channel opens");
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
    motion
}

/// Trickles candidates both ways (the browser's from `cand_rx`) until the
/// agent reports `session` connected; returns that message.
async fn trickle(
    browser: &RTCPeerConnection,
    in_tx: &mpsc::Sender<Inbound>,
    sig_rx: &mut mpsc::Receiver<Envelope>,
    cand_rx: &mut mpsc::Receiver<String>,
    session: &str,
) -> Value {
    loop {
        tokio::select! {
            c = cand_rx.recv() => {
                let c = c.expect("browser candidate");
                let payload = IceCandidatePayload {
                    connection_id: session.into(),
                    candidate: c,
                    sdp_mid: "0".into(),
                    sdp_m_line_index: 0,
                    username_fragment: None,
                };
                in_tx.send(Inbound::RemoteCandidate(payload)).await.expect("candidate");
            }
            e = tokio::time::timeout(WAIT, sig_rx.recv()) => {
                let v = validated(&e.expect("agent signal in time").expect("open"));
                match v["type"].as_str() {
                    Some("signalling.ice_candidate") => {
                        assert_eq!(v["payload"]["sdpMid"], "0");
                        browser.add_ice_candidate(candidate_init(&v)).await.expect("agent candidate");
                    }
                    Some("signalling.connected") => return v,
                    other => panic!("unexpected {other:?}: {v}"),
                }
            }
        }
    }
}

/// The next message on a data channel, checked against the spec.
async fn next_text(messages: &mut mpsc::Receiver<String>) -> Value {
    let text = tokio::time::timeout(WAIT, messages.recv())
        .await
        .expect("a message in time")
        .expect("channel open");
    let v: Value = serde_json::from_str(&text).expect("json");
    SchemaValidator::shared()
        .validate(&v)
        .unwrap_or_else(|e| panic!("agent sent a message that breaks the spec: {e}\n{v}"));
    v
}

/// An `agent.ping` with `id` on `channel`.
async fn ping(channel: &RTCDataChannel, id: &str) {
    let ping = json!({"type": "agent.ping", "version": "0.5", "id": id,
        "timestamp": crate::testutil::rfc3339_ms(crate::testutil::client_now_ms())});
    channel
        .send_text(ping.to_string())
        .await
        .expect("send ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_a_teleop_style_offer_and_serves_the_control_channel() {
    // The agent side.
    let (controller, mut end) = ready_controller().await;
    let shared = testutil::shared(controller, None);
    let (in_tx, mut sig_rx) = spawn_manager(64, |sig_tx| {
        PeerManager::new(&loopback(), sig_tx, shared).expect("manager")
    });
    online(&in_tx).await;

    // The browser side.
    let (browser, control) = teleop_browser().await;
    let mut msg_rx = messages(&control, 16);
    let mut cand_rx = local_candidates(&browser);
    let offer_sdp = local_offer(&browser).await;
    send_offer(&in_tx, "s-1", offer_sdp, Role::Operator, "alice").await;
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
    let connected = trickle(&browser, &in_tx, &mut sig_rx, &mut cand_rx, "s-1").await;
    for v in agent_candidates {
        let _ = browser.add_ice_candidate(candidate_init(&v)).await;
    }
    assert_eq!(
        connected["payload"],
        json!({"connectionId": "s-1", "iceConnectionState": "connected", "dataChannelState": "open"})
    );

    // The agent greets with its capabilities, then answers a ping.
    let caps = next_text(&mut msg_rx).await;
    assert_eq!(caps["type"], "agent.capabilities");
    ping(&control, "p-1").await;
    assert_eq!(next_text(&mut msg_rx).await["correlationId"], "p-1");

    // Movement on a second, unordered, no-retransmit channel (as our SDK
    // sends it) reaches the driver through the same session.
    let motion = move_on_a_motion_channel(&browser, &mut end).await;
    // Closing that extra channel does not end the session.
    motion.close().await.expect("close motion");
    ping(&control, "p-2").await;
    assert_eq!(next_text(&mut msg_rx).await["correlationId"], "p-2");

    // The browser leaves: the agent reports the session closed.
    browser.close().await.expect("close");
    let mut ignored = Vec::new();
    let gone = next_signal(&mut sig_rx, "signalling.disconnected", &mut ignored).await;
    assert_eq!(gone["payload"]["connectionId"], "s-1");
}

#[tokio::test]
async fn a_broken_offer_is_reported_as_failed() {
    let (driver, _end) = DriverHandle::channel();
    let shared = testutil::shared(controller::spawn(SafetyLimits::default(), driver), None);
    let (in_tx, mut sig_rx) = spawn_manager(8, |sig_tx| {
        PeerManager::new(&loopback(), sig_tx, shared).expect("manager")
    });
    in_tx
        .send(Inbound::Offer {
            session: "bad".into(),
            sdp: "not sdp".into(),
            role: Role::Owner,
            subject: None,
            ticket_expires: None,
        })
        .await
        .expect("offer");
    let mut ignored = Vec::new();
    let failed = next_signal(&mut sig_rx, "signalling.disconnected", &mut ignored).await;
    assert_eq!(failed["payload"]["reason"], "failed");
}

/// The agent side with the given cameras, online without ICE servers.
async fn agent_with_cameras(
    cameras: Vec<Arc<Camera>>,
) -> (mpsc::Sender<Inbound>, mpsc::Receiver<Envelope>) {
    let (driver, end) = DriverHandle::channel();
    end.events.send(DriverEvent::Ready).await.expect("ready");
    // The driver's end lives as long as the test.
    std::mem::forget(end);
    let shared = testutil::shared(controller::spawn(SafetyLimits::default(), driver), None);
    let (in_tx, sig_rx) = spawn_manager(256, |sig_tx| {
        PeerManager::new(&loopback(), sig_tx, shared)
            .expect("manager")
            .with_cameras(cameras)
    });
    online(&in_tx).await;
    (in_tx, sig_rx)
}

/// A webrtc-rs "browser" with a control channel and one recvonly video
/// transceiver; counts the H.264 RTP packets it receives.
struct Viewer {
    pc: Arc<webrtc::peer_connection::RTCPeerConnection>,
    control: Arc<RTCDataChannel>,
    messages: mpsc::Receiver<String>,
    packets: Arc<std::sync::atomic::AtomicU64>,
    codec: Arc<std::sync::Mutex<Option<String>>>,
}

async fn viewer_session(
    in_tx: &mpsc::Sender<Inbound>,
    sig_rx: &mut mpsc::Receiver<Envelope>,
    session: &str,
) -> (Viewer, String) {
    let (pc, control) = teleop_browser().await;
    let messages = messages(&control, 64);
    let packets = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let codec = Arc::new(std::sync::Mutex::new(None));
    let (count, seen) = (packets.clone(), codec.clone());
    pc.on_track(Box::new(move |track, _, _| {
        let (count, seen) = (count.clone(), seen.clone());
        Box::pin(async move {
            *seen.lock().expect("lock") = Some(track.codec().capability.mime_type.clone());
            tokio::spawn(async move {
                while track.read_rtp().await.is_ok() {
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        })
    }));
    let offer = complete_offer(&pc).await;
    send_offer(in_tx, session, offer, Role::Viewer, "viewer").await;
    // The offer carried all of the browser's candidates; the agent trickles.
    let (sdp, connected) = connect(&pc, sig_rx).await;
    assert_eq!(connected["payload"]["connectionId"], session);
    (
        Viewer {
            pc,
            control,
            messages,
            packets,
            codec,
        },
        sdp,
    )
}

async fn next_message(viewer: &mut Viewer) -> Value {
    next_text(&mut viewer.messages).await
}

fn video_section(sdp: &str) -> String {
    sdp.split("m=")
        .find(|m| m.starts_with("video"))
        .expect("video m-line answered")
        .to_owned()
}

/// An H.264 RTP stream as a pipeline sends it: SPS+PPS in a STAP-A, then
/// an IDR, then P slices, 30 pictures per second.
fn h264_rtp(seq: u16, picture: u32) -> Vec<u8> {
    use webrtc::util::Marshal;
    let payload: Vec<u8> = match seq % 3 {
        0 => vec![
            24, 0, 5, 0x67, 0x42, 0xc0, 0x1f, 0xaa, 0, 4, 0x68, 0xce, 0x3c, 0x80,
        ],
        1 => vec![0x65, 0x88, 1, 2, 3],
        _ => vec![0x41, 0x9a, 4, 5],
    };
    let packet = webrtc::rtp::packet::Packet {
        header: webrtc::rtp::header::Header {
            version: 2,
            marker: !seq.is_multiple_of(3),
            payload_type: 96,
            sequence_number: seq,
            timestamp: picture * 3000,
            ssrc: 42,
            ..Default::default()
        },
        payload: bytes::Bytes::from(payload),
    };
    packet.marshal().expect("marshal").to_vec()
}

async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Sends H.264 RTP to the camera's `port` until both viewers got 30 packets;
/// returns the next sequence number.
async fn stream_until_both_got_video(
    source: &tokio::net::UdpSocket,
    port: u16,
    first: &Viewer,
    second: &Viewer,
) -> u16 {
    let mut seq = 0u16;
    let (a, b) = (first.packets.clone(), second.packets.clone());
    let deadline = tokio::time::Instant::now() + WAIT;
    while a.load(std::sync::atomic::Ordering::Relaxed) < 30
        || b.load(std::sync::atomic::Ordering::Relaxed) < 30
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "video reached both sessions"
        );
        source
            .send_to(&h264_rtp(seq, u32::from(seq / 3)), ("127.0.0.1", port))
            .await
            .expect("send");
        seq = seq.wrapping_add(1);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    seq
}

/// Not H.264 on the camera's port: unavailable, counted, not forwarded;
/// good packets again (from `seq` on): available again.
async fn bad_input_then_recovery(
    source: &tokio::net::UdpSocket,
    port: u16,
    front: &Camera,
    seq: u16,
) {
    for _ in 0..120 {
        source
            .send_to(
                &[0x80, 96, 0, 1, 0, 0, 0, 1, 0, 0, 0, 42, 0x90, 0x80, 0x12],
                ("127.0.0.1", port),
            )
            .await
            .expect("send");
    }
    wait_for("bad input marks the camera unavailable", || {
        !front.available()
    })
    .await;
    assert!(CameraStats::get(&front.stats.invalid_input) >= 100);
    // Good packets again: available again.
    for i in 0..6u16 {
        source
            .send_to(&h264_rtp(seq.wrapping_add(i), 1000), ("127.0.0.1", port))
            .await
            .expect("send");
    }
    wait_for("the camera recovers", || front.available()).await;
}

/// A dead command: the first session starts it, it fails, and the next
/// session hears that the camera is unavailable (and opens without it).
async fn a_dead_command_is_reported_to_the_next_session() {
    let rear_only = Camera::start(
        "rear=exec:exit 3".parse().expect("spec"),
        std::time::Duration::from_millis(200),
    );
    let (in_tx2, mut sig_rx2) = agent_with_cameras(vec![rear_only.clone()]).await;
    let (mut fourth, _) = viewer_session(&in_tx2, &mut sig_rx2, "v-4").await;
    let _ = next_message(&mut fourth).await;
    wait_for("the dead command marks the camera unavailable", || {
        !rear_only.available()
    })
    .await;
    assert!(CameraStats::get(&rear_only.stats.failures) >= 1);
    fourth.pc.close().await.expect("close");
    let mut ignored = Vec::new();
    let gone = next_signal(&mut sig_rx2, "signalling.disconnected", &mut ignored).await;
    assert_eq!(gone["payload"]["connectionId"], "v-4");
    let (mut fifth, sdp) = viewer_session(&in_tx2, &mut sig_rx2, "v-5").await;
    assert!(
        video_section(&sdp).contains("a=inactive"),
        "no video from an unavailable camera; the session still opens"
    );
    let caps = next_message(&mut fifth).await;
    assert_eq!(caps["meta"]["cameras"][0]["available"], false);
    let error = next_message(&mut fifth).await;
    assert_eq!(error["type"], "agent.error");
    assert_eq!(error["payload"]["code"], "AGENT_UNAVAILABLE");
    assert_eq!(error["payload"]["details"]["camera"], "rear");
    fifth.pc.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_rtp_camera_feeds_every_session_and_a_dead_one_is_reported() {
    // A free port for the RTP camera: bind, read, release.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("probe")
        .local_addr()
        .expect("addr")
        .port();
    let front = Camera::start(
        format!("front=rtp:127.0.0.1:{port}").parse().expect("spec"),
        std::time::Duration::from_millis(200),
    );
    // A command that dies at once: unavailable after its first viewer.
    let rear = Camera::start(
        "rear=exec:echo 'no camera here' >&2; exit 3"
            .parse()
            .expect("spec"),
        std::time::Duration::from_millis(200),
    );
    let (in_tx, mut sig_rx) = agent_with_cameras(vec![front.clone(), rear.clone()]).await;

    let (mut first, sdp) = viewer_session(&in_tx, &mut sig_rx, "v-1").await;
    let video = video_section(&sdp);
    assert!(
        video.contains("a=sendonly"),
        "camera answered sendonly:\n{video}"
    );
    assert!(video.contains("H264"), "H.264 negotiated:\n{video}");
    let caps = next_message(&mut first).await;
    assert_eq!(caps["type"], "agent.capabilities");
    let names: Vec<_> = caps["meta"]["cameras"]
        .as_array()
        .expect("cameras")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(names, vec!["front", "rear"]);
    assert_eq!(
        front.users(),
        1,
        "the first session watches the first camera"
    );
    assert_eq!(rear.users(), 0, "one video m-line, one camera");

    let (mut second, _) = viewer_session(&in_tx, &mut sig_rx, "v-2").await;
    let _ = next_message(&mut second).await;
    assert_eq!(front.users(), 2);

    // One stream in, both sessions get it.
    let source = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("src");
    let seq = stream_until_both_got_video(&source, port, &first, &second).await;
    for viewer in [&first, &second] {
        assert_eq!(
            viewer.codec.lock().expect("lock").as_deref(),
            Some("video/H264")
        );
    }
    assert!(front.status().available);

    bad_input_then_recovery(&source, port, &front, seq).await;

    // Sessions end: nobody watches.
    first.pc.close().await.expect("close");
    second.pc.close().await.expect("close");
    wait_for("sessions released the camera", || front.users() == 0).await;

    drop(rear);
    a_dead_command_is_reported_to_the_next_session().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_camera_runs_while_watched_and_stops_after_the_grace() {
    // An Annex-B stream from the shell: SPS, PPS, IDR, then P slices.
    let command = "printf '\\000\\000\\000\\001\\147\\102\\300\\037\\252\\000\\000\\000\\001\\150\\316\\074\\200\\000\\000\\000\\001\\145\\210\\001\\002'; \
                   while true; do printf '\\000\\000\\000\\001\\101\\232\\004\\005'; sleep 0.02; done";
    let camera = Camera::start(
        VideoSpec::new("front", &format!("exec:{command}")).expect("spec"),
        std::time::Duration::from_millis(300),
    );
    assert_eq!(
        CameraStats::get(&camera.stats.starts),
        0,
        "not started without a viewer"
    );
    let (in_tx, mut sig_rx) = agent_with_cameras(vec![camera.clone()]).await;
    let (mut viewer, _) = viewer_session(&in_tx, &mut sig_rx, "e-1").await;
    let _ = next_message(&mut viewer).await;
    let packets = viewer.packets.clone();
    wait_for("pictures reach the session", || {
        packets.load(std::sync::atomic::Ordering::Relaxed) >= 20
    })
    .await;
    assert_eq!(CameraStats::get(&camera.stats.starts), 1);
    assert!(camera.available());
    viewer.pc.close().await.expect("close");
    wait_for("released", || camera.users() == 0).await;
    // After the grace period the command is stopped: no more pictures.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let before = CameraStats::get(&camera.stats.frames);
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        if CameraStats::get(&camera.stats.frames) == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the source stops after the grace period"
        );
    }
    assert_eq!(
        CameraStats::get(&camera.stats.starts),
        1,
        "stopped, not restarted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ice_restart_offer_is_answered_in_the_same_session() {
    let (in_tx, mut sig_rx) = agent_with_cameras(Vec::new()).await;
    let (mut viewer, first_answer) = viewer_session(&in_tx, &mut sig_rx, "r-1").await;
    let _ = next_message(&mut viewer).await; // capabilities

    let offer = viewer
        .pc
        .create_offer(Some(
            webrtc::peer_connection::offer_answer_options::RTCOfferOptions {
                ice_restart: true,
                voice_activity_detection: false,
            },
        ))
        .await
        .expect("restart offer");
    let mut gathered = viewer.pc.gathering_complete_promise().await;
    viewer.pc.set_local_description(offer).await.expect("local");
    let _ = gathered.recv().await;
    let sdp = viewer.pc.local_description().await.expect("sdp").sdp;
    send_offer(&in_tx, "r-1", sdp, Role::Viewer, "viewer").await;
    let mut candidates = Vec::new();
    let answer = next_signal(&mut sig_rx, "signalling.answer", &mut candidates).await;
    assert_eq!(answer["payload"]["connectionId"], "r-1");
    let sdp = answer["payload"]["sdp"].as_str().expect("sdp").to_owned();
    assert_ne!(
        ice_ufrag(&sdp),
        ice_ufrag(&first_answer),
        "the agent restarted ICE (new credentials)"
    );
    viewer
        .pc
        .set_remote_description(RTCSessionDescription::answer(sdp).expect("answer"))
        .await
        .expect("remote");
    // Same session, same channel: a ping is answered over the restarted
    // ICE (the agent's new candidates trickle in), nothing was torn down.
    ping(&viewer.control, "after-restart").await;
    let add = |v: Value| {
        let pc = viewer.pc.clone();
        async move {
            let _ = pc.add_ice_candidate(candidate_init(&v)).await;
        }
    };
    for c in candidates.drain(..) {
        add(c).await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        tokio::select! {
            e = sig_rx.recv() => {
                let v = validated(&e.expect("signalling open"));
                assert_eq!(v["type"], "signalling.ice_candidate", "session kept: {v}");
                add(v).await;
            }
            m = viewer.messages.recv() => {
                let v: Value = serde_json::from_str(&m.expect("channel open")).expect("json");
                SchemaValidator::shared().validate(&v).expect("valid");
                if v["correlationId"] == "after-restart" {
                    break;
                }
            }
            () = tokio::time::sleep_until(deadline) => panic!("no pong after the ICE restart"),
        }
    }
    viewer.pc.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_camera_that_dies_mid_session_is_announced_and_its_return_too() {
    // A few pictures, then the command exits once the test says so (it is
    // restarted with backoff, and then stays).
    let dir = crate::testutil::temp_dir("camera-dies");
    let gate = dir.join("exit-now");
    let command = format!("printf '\\000\\000\\000\\001\\147\\102\\300\\037\\252\\000\\000\\000\\001\\150\\316\\074\\200\\000\\000\\000\\001\\145\\210\\001\\002\\000\\000\\000\\001\\101\\232\\004\\005'; \
                   while [ ! -e {gate} ]; do sleep 0.05; done; rm -f {gate}; exit 1", gate = gate.display());
    let camera = Camera::start(
        VideoSpec::new("front", &format!("exec:{command}")).expect("spec"),
        std::time::Duration::from_millis(300),
    );
    let (in_tx, mut sig_rx) = agent_with_cameras(vec![camera.clone()]).await;
    let (mut viewer, _) = viewer_session(&in_tx, &mut sig_rx, "d-1").await;
    let caps = next_message(&mut viewer).await;
    assert_eq!(caps["meta"]["cameras"][0]["available"], true);
    std::fs::write(&gate, b"").expect("gate");
    let error = next_message(&mut viewer).await;
    assert_eq!(error["type"], "agent.error", "{error}");
    assert_eq!(error["payload"]["code"], "AGENT_UNAVAILABLE");
    assert_eq!(error["payload"]["details"]["reason"], "camera_unavailable");
    assert_eq!(error["payload"]["details"]["camera"], "front");
    let caps = next_message(&mut viewer).await;
    assert_eq!(caps["type"], "agent.capabilities");
    assert_eq!(caps["meta"]["cameras"][0]["available"], false);
    // Restarted: the stream is H.264 again, and the session hears it.
    let caps = next_message(&mut viewer).await;
    assert_eq!(caps["type"], "agent.capabilities");
    assert_eq!(caps["meta"]["cameras"][0]["available"], true);
    assert!(CameraStats::get(&camera.stats.starts) >= 2);
    viewer.pc.close().await.expect("close");
}

/// Issue 29: one viewer socket sending 16 offers must not lock the
/// operator out; the agent keeps a slot for the controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_filling_every_slot_leave_one_for_the_operator() {
    let (driver, _end) = DriverHandle::channel();
    let shared = testutil::shared(controller::spawn(SafetyLimits::default(), driver), None);
    let (in_tx, mut sig_rx) = spawn_manager(4096, |sig_tx| {
        PeerManager::new(&loopback(), sig_tx, shared).expect("manager")
    });
    let (_browser, sdp) = offer_sdp(&["control"]).await;
    for i in 0..MAX_SESSIONS {
        let viewer = format!("viewer-{i}");
        send_offer(&in_tx, &viewer, sdp.clone(), Role::Viewer, "mallory").await;
    }
    send_offer(&in_tx, "operator", sdp, Role::Operator, "alice").await;
    // Every offer is answered or refused, in order; the operator's last.
    let mut answered = std::collections::HashSet::new();
    let (mut refused, mut evicted) = (0, 0);
    let operator = loop {
        let envelope = tokio::time::timeout(WAIT, sig_rx.recv())
            .await
            .expect("signal in time")
            .expect("open");
        let v = validated(&envelope);
        let session = v["payload"]["connectionId"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        match (v["type"].as_str(), session.starts_with("viewer-")) {
            (Some("signalling.answer"), true) => {
                answered.insert(session);
            }
            (Some("signalling.disconnected"), true) => {
                if answered.contains(&session) {
                    evicted += 1;
                } else {
                    refused += 1;
                }
            }
            (Some("signalling.answer" | "signalling.disconnected"), false) => break v,
            _ => {}
        }
    };
    assert_eq!(
        operator["type"], "signalling.answer",
        "the operator's offer was refused: {operator}"
    );
    assert!(refused + evicted >= 1, "a viewer gave way");
    assert!(answered.len() - evicted < MAX_SESSIONS, "a slot was kept");

    // Full now (15 viewers and the operator): another controller's offer
    // evicts the oldest viewer.
    let sdp = offer_sdp(&["control"]).await.1;
    send_offer(&in_tx, "owner", sdp, Role::Owner, "olga").await;
    let mut evicted_viewer = None;
    let owner = loop {
        let envelope = tokio::time::timeout(WAIT, sig_rx.recv())
            .await
            .expect("signal in time")
            .expect("open");
        let v = validated(&envelope);
        match (v["type"].as_str(), v["payload"]["connectionId"].as_str()) {
            (Some("signalling.disconnected"), Some(id)) if id.starts_with("viewer-") => {
                evicted_viewer = Some(id.to_owned());
            }
            (Some("signalling.answer" | "signalling.disconnected"), Some("owner")) => break v,
            _ => {}
        }
    };
    assert_eq!(owner["type"], "signalling.answer", "{owner}");
    assert_eq!(
        evicted_viewer.as_deref(),
        Some("viewer-0"),
        "the oldest viewer"
    );
}

/// The ARP handler on a data channel labelled `arp`: the session's role
/// (`meta.session.role`) decides, as on the local WebSocket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arp_data_channel_is_served_with_the_sessions_role() {
    use signalling_protocol::arp_schema::ArpValidator;

    let (driver, mut end) = DriverHandle::channel();
    let pose = driver.pose.clone();
    end.events.send(DriverEvent::Ready).await.expect("ready");
    let shared = testutil::shared(controller::spawn(SafetyLimits::default(), driver), None);
    let arp = crate::arp::ArpServer::new(shared.clone(), pose, crate::arp::ArpOptions::default());
    let (in_tx, mut sig_rx) = spawn_manager(256, |sig_tx| {
        PeerManager::new(&loopback(), sig_tx, shared)
            .expect("manager")
            .with_arp(arp)
    });

    let browser = browser().await;
    let channel = browser
        .create_data_channel("arp", None)
        .await
        .expect("arp channel");
    let mut msg_rx = messages(&channel, 64);
    let mut open_rx = opened(&channel);
    let sdp = complete_offer(&browser).await;
    send_offer(&in_tx, "s-arp", sdp, Role::Viewer, "vera").await;
    connect_until_open(&browser, &mut sig_rx, &mut open_rx).await;
    let mut methods = std::collections::HashMap::new();
    let mut n = 0;
    let mut call = async |method: &str, params: Value| -> Value {
        n += 1;
        methods.insert(n, method.to_owned());
        let request = json!({"jsonrpc": "2.0", "id": n, "method": method, "params": params});
        ArpValidator::shared()
            .validate(&request, None)
            .expect("valid request");
        channel.send_text(request.to_string()).await.expect("send");
        loop {
            let text = tokio::time::timeout(WAIT, msg_rx.recv())
                .await
                .expect("arp answer in time")
                .expect("channel open");
            let v: Value = serde_json::from_str(&text).expect("JSON");
            let answered = v["id"].as_u64().and_then(|id| methods.get(&id)).cloned();
            ArpValidator::shared()
                .validate(&v, answered.as_deref())
                .unwrap_or_else(|e| panic!("invalid ARP from the agent: {e}\n{v}"));
            if v["id"] == n {
                return v;
            }
        }
    };
    let init = call(
        "arp.initialize",
        json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "dc", "version": "1"}}),
    )
    .await;
    assert_eq!(init["result"]["protocolVersion"], "0.1.0");
    let drive = call(
        "arp.callTool",
        json!({"name": "drive", "arguments": {"linear": 0.1, "angular": 0, "durationSecs": 1}}),
    )
    .await;
    assert_eq!(drive["error"]["code"], -40001);
    assert_eq!(drive["error"]["data"]["reason"], "forbidden");
    let stop = call("arp.emergencyStop", json!({"reason": "viewer saw smoke"})).await;
    assert_eq!(stop["result"]["stopped"], true);
    let command = tokio::time::timeout(WAIT, end.commands.recv())
        .await
        .expect("driver told in time")
        .expect("command");
    assert!(
        matches!(
            command,
            crate::driver::DriverCommand::Stop {
                reason: StopReason::EmergencyStop
            }
        ),
        "{command:?}"
    );
}

/// One controller across teleop and ARP: the sim driver, the local ARP
/// WebSocket and the peer manager on one controller.
struct OneController {
    arp: crate::testutil::arp::Fixture,
    in_tx: mpsc::Sender<Inbound>,
    sig_rx: mpsc::Receiver<Envelope>,
    /// The browsers' peer connections, kept open while the test runs.
    browsers: Vec<Arc<webrtc::peer_connection::RTCPeerConnection>>,
}

async fn one_controller() -> OneController {
    let arp = crate::testutil::arp::fixture(crate::arp::ArpOptions::default()).await;
    let shared = testutil::shared(arp.controller.clone(), None);
    let (in_tx, sig_rx) = spawn_manager(256, |sig_tx| {
        PeerManager::new(&loopback(), sig_tx, shared)
            .expect("manager")
            .with_arp(arp.server.clone())
    });
    OneController {
        arp,
        in_tx,
        sig_rx,
        browsers: Vec::new(),
    }
}

impl OneController {
    /// A teleop offer (a `control` channel); the agent's verdict on it:
    /// `signalling.answer` or `signalling.disconnected`.
    async fn offer(&mut self, session: &str, role: Role) -> Value {
        let (browser, sdp) = offer_sdp(&["control"]).await;
        self.browsers.push(browser);
        self.in_tx
            .send(Inbound::Offer {
                session: session.into(),
                sdp,
                role,
                subject: Some(format!("{session}-subject")),
                ticket_expires: None,
            })
            .await
            .expect("offer");
        loop {
            let envelope = tokio::time::timeout(WAIT, self.sig_rx.recv())
                .await
                .expect("a verdict in time")
                .expect("signalling open");
            let v = validated(&envelope);
            let verdict = matches!(
                v["type"].as_str(),
                Some("signalling.answer" | "signalling.disconnected")
            );
            if verdict && v["payload"]["connectionId"] == session {
                return v;
            }
        }
    }
}

fn arp_init() -> Value {
    json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "t", "version": "1"}})
}

/// Teleop first: an ARP operator (or owner) initializing while a teleop
/// operator session holds control gets -40004 `robot_busy`; viewers are
/// not busy; when the session ends, control is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arp_operator_is_busy_while_a_teleop_operator_holds_control() {
    use crate::testutil::arp::{Client, OPERATOR, VIEWER};
    let mut agent = one_controller().await;
    let answer = agent.offer("teleop-op", Role::Operator).await;
    assert_eq!(answer["type"], "signalling.answer", "{answer}");

    let mut arp = Client::connect(&agent.arp.url, OPERATOR).await;
    let busy = arp.call("arp.initialize", arp_init()).await;
    assert_eq!(busy["error"]["code"], -40004, "{busy}");
    assert_eq!(busy["error"]["data"]["reason"], "robot_busy");
    let mut viewer = Client::connect(&agent.arp.url, VIEWER).await;
    viewer.initialize().await;

    // The session ends: the ARP operator may take control now.
    agent
        .in_tx
        .send(Inbound::Disconnected {
            session: "teleop-op".into(),
        })
        .await
        .expect("disconnected");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let init = arp.call("arp.initialize", arp_init()).await;
        if init.get("result").is_some() {
            break;
        }
        assert_eq!(init["error"]["data"]["reason"], "robot_busy", "{init}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "control never freed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let drive = arp
        .tool(
            "drive",
            json!({"linear": 0.2, "angular": 0, "durationSecs": 0.3}),
        )
        .await;
    assert_eq!(drive["result"]["state"], "completed", "{drive}");
    assert!(agent.arp.probe.state().x > 0.0, "the ARP operator drove");
}

/// ARP first: a teleop operator or owner offer while an ARP operator holds
/// control is refused (`disconnected {reason: "failed"}`, details
/// `robot_busy`), a non-holder's motion never reaches the sim, viewers
/// are unaffected; when the ARP connection closes, control is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teleop_offer_is_refused_while_an_arp_operator_holds_control() {
    use crate::testutil::arp::{Client, OPERATOR};
    let mut agent = one_controller().await;
    let mut arp = Client::connect(&agent.arp.url, OPERATOR).await;
    arp.initialize().await;

    for (session, role) in [("teleop-op", Role::Operator), ("teleop-owner", Role::Owner)] {
        let refused = agent.offer(session, role).await;
        assert_eq!(refused["type"], "signalling.disconnected", "{refused}");
        assert_eq!(refused["payload"]["reason"], "failed");
        assert_eq!(refused["payload"]["details"]["reason"], "robot_busy");
    }
    let viewer = agent.offer("teleop-viewer", Role::Viewer).await;
    assert_eq!(viewer["type"], "signalling.answer", "{viewer}");

    // Whoever is not the holder does not move the robot.
    assert!(agent
        .arp
        .controller
        .movement("teleop-op", Role::Operator, 1.0, 0.0)
        .await
        .is_err());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let state = agent.arp.probe.state();
    assert_eq!((state.x, state.linear), (0.0, 0.0), "the sim moved");

    // The ARP operator goes away: a teleop operator gets control.
    drop(arp);
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut n = 0;
    loop {
        n += 1;
        let verdict = agent.offer(&format!("teleop-op-{n}"), Role::Operator).await;
        if verdict["type"] == "signalling.answer" {
            break;
        }
        assert_eq!(verdict["payload"]["details"]["reason"], "robot_busy");
        assert!(
            tokio::time::Instant::now() < deadline,
            "control never freed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// An `arp` channel belongs to its session: the ARP handler, told the
/// session it rides on (as the peer manager does), shares the control of
/// a teleop operator session, while another session's channel is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arp_channel_shares_the_control_of_its_own_session() {
    let mut agent = one_controller().await;
    let answer = agent.offer("s-op", Role::Operator).await;
    assert_eq!(answer["type"], "signalling.answer", "{answer}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "arp.initialize", "params": arp_init()});
    let initialize = async |session: &str| -> Value {
        let (in_tx, in_rx) = mpsc::channel(crate::arp::FRAME_CHANNEL);
        let (out_tx, mut out_rx) = mpsc::channel(crate::arp::FRAME_CHANNEL);
        let _handler = agent.arp.server.connect(
            crate::arp::Peer {
                key: format!("{session}/arp"),
                session: Some(session.to_owned()),
                role: Role::Operator,
                subject: session.to_owned(),
            },
            in_rx,
            out_tx,
        );
        in_tx.send(init.to_string()).await.expect("frame");
        let text = tokio::time::timeout(WAIT, out_rx.recv())
            .await
            .expect("answer in time")
            .expect("open");
        serde_json::from_str(&text).expect("JSON")
    };
    let other = initialize("s-other").await;
    assert_eq!(other["error"]["data"]["reason"], "robot_busy", "{other}");
    let own = initialize("s-op").await;
    assert!(own.get("result").is_some(), "{own}");
}
