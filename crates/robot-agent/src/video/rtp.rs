//! `rtp:HOST:PORT`: H.264 RTP from a local pipeline, forwarded without
//! re-encoding or re-packetising. `TrackLocalStaticRTP` gives each session
//! its own SSRC and payload type; the agent only puts the latest SPS/PPS
//! in front of an IDR picture that came without them (see [`RtpParams`]).
//!
//! The socket is bound at start-up and kept: a pipeline sends whether or not
//! anyone watches, and a port in use is reported before the first session.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::UdpSocket;
use webrtc::rtp::codecs::h264::H264Packet;
use webrtc::rtp::packet::Packet;
use webrtc::rtp::packetizer::Depacketizer;
use webrtc::track::track_local::TrackLocalWriter;
use webrtc::util::Unmarshal;

use super::h264::{annex_b_nals, is_keyframe, AccessUnits, Forward, RtpParams};
use super::{Camera, CameraStats, Track, RESTART_INITIAL, RESTART_MAX};
use crate::driver::RestartBackoff;

/// Consecutive packets that are not H.264 RTP before the camera is
/// declared unavailable (a few stray packets are tolerated).
const INVALID_RUN: u64 = 100;
/// Largest datagram accepted (RTP over a local link fits an Ethernet MTU).
const MAX_DATAGRAM: usize = 2048;

pub(super) async fn run(camera: Arc<Camera>, addr: SocketAddr) {
    let Track::Rtp(track) = camera.track.clone() else {
        return;
    };
    let mut backoff = RestartBackoff::new(RESTART_INITIAL, RESTART_MAX);
    let socket = loop {
        match UdpSocket::bind(addr).await {
            Ok(s) => break s,
            Err(e) => {
                camera.fail(format!("cannot listen for RTP on {addr}: {e}"));
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    };
    camera.recovered();
    tracing::info!(camera = %camera.name, %addr, "listening for H.264 RTP");
    let mut params = RtpParams::default();
    let mut stills = Stills::default();
    let mut invalid_run: u64 = 0;
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let n = match socket.recv(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(camera = %camera.name, error = %e, "RTP receive");
                continue;
            }
        };
        let forward = match Packet::unmarshal(&mut &buf[..n]) {
            Ok(packet) if packet.header.version == 2 => {
                stills.packet(&camera, &packet.payload);
                params.process(packet)
            }
            _ => Forward::Invalid,
        };
        let packets = match forward {
            Forward::Invalid => {
                CameraStats::add(&camera.stats.invalid_input, 1);
                invalid_run += 1;
                if invalid_run == INVALID_RUN {
                    camera.fail(format!(
                        "input on {addr} is not H.264 RTP ({INVALID_RUN} bad packets in a row)"
                    ));
                }
                continue;
            }
            Forward::Packets(p) => p,
        };
        invalid_run = 0;
        if params.seen_sps() {
            camera.recovered();
        }
        for packet in &packets {
            if let Err(e) = track.write_rtp(packet).await {
                tracing::debug!(camera = %camera.name, error = %e, "forwarding RTP");
            }
        }
        CameraStats::add(&camera.stats.frames, packets.len() as u64);
        camera
            .stats
            .params_inserted
            .store(params.params_inserted, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The pictures of the RTP stream, depacketised (STAP-A, FU-A) and grouped as an `exec:`
/// source's are, for the camera's latest keyframe (`capture_image`); the packets themselves
/// are forwarded untouched.
#[derive(Default)]
struct Stills {
    depacketizer: H264Packet,
    units: AccessUnits,
}

impl Stills {
    fn packet(&mut self, camera: &Camera, payload: &bytes::Bytes) {
        // Not H.264, or a fragment lost: that picture is skipped.
        let Ok(nals) = self.depacketizer.depacketize(payload) else {
            return;
        };
        for nal in annex_b_nals(&nals) {
            if let Some(unit) = self.units.push(nal) {
                if is_keyframe(&unit) {
                    camera.keyframe(unit);
                }
            }
        }
    }
}
