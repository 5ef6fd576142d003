//! Cameras: H.264 video from the robot to every session.
//!
//! Each configured source (`--video NAME=SOURCE`, `[[video]]` in agent.toml)
//! owns one webrtc-rs local track. The same track is attached to the video
//! m-line of every session that asks for video, and webrtc-rs writes each
//! packet to all of its bindings: one source, one packetisation, however many
//! viewers (no per-viewer encoding).
//!
//! * `exec:COMMAND`: the command's stdout is an H.264 Annex-B stream; it is
//!   read with webrtc-media's `H264Reader`, grouped into pictures and
//!   packetised by `TrackLocalStaticSample`. The command runs while a
//!   session wants video (plus a grace period) and is restarted with backoff
//!   if it dies; its stderr goes to the log.
//! * `rtp:HOST:PORT`: H.264 RTP from a local pipeline, forwarded as is
//!   through `TrackLocalStaticRTP` (which rewrites SSRC and payload type per
//!   session).
//!
//! Keyframes: neither source can be asked for one (a pipeline's encoder is
//! not ours to drive), so viewers that join late wait for the source's next
//! IDR picture, and the agent makes sure that picture is decodable at once by
//! sending the latest SPS/PPS in front of it when the source did not. Keep
//! the source's keyframe interval short (`-g 30`, `key-int-max=30`). PLI/FIR
//! from viewers are counted.

mod exec;
pub mod h264;
mod rtp;
pub mod still;

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};
use webrtc::api::media_engine::MIME_TYPE_H264;
use webrtc::rtp_transceiver::rtp_codec::RTCRtpCodecCapability;
use webrtc::track::track_local::track_local_static_rtp::TrackLocalStaticRTP;
use webrtc::track::track_local::track_local_static_sample::TrackLocalStaticSample;
use webrtc::track::track_local::TrackLocal;

/// How long an `exec:` source keeps running after its last viewer left (a
/// page reload should not restart the encoder).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// Restart backoff of a dead source.
const RESTART_INITIAL: Duration = Duration::from_millis(500);
const RESTART_MAX: Duration = Duration::from_secs(30);
/// Stream id of every camera track (one "robot" media stream).
const STREAM_ID: &str = "robot";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VideoError {
    #[error("invalid video {0:?}: expected NAME=SOURCE")]
    Spec(String),
    #[error("invalid camera name {0:?}: 1-64 characters of A-Z a-z 0-9 _ -")]
    Name(String),
    #[error("invalid video source {0:?}: expected exec:COMMAND or rtp:HOST:PORT")]
    Source(String),
    #[error("duplicate camera name {0:?}")]
    Duplicate(String),
}

/// Where a camera's H.264 comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceSpec {
    Exec(String),
    Rtp(SocketAddr),
}

impl SourceSpec {
    pub fn kind(&self) -> &'static str {
        match self {
            SourceSpec::Exec(_) => "exec",
            SourceSpec::Rtp(_) => "rtp",
        }
    }
}

impl FromStr for SourceSpec {
    type Err = VideoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || VideoError::Source(s.to_owned());
        if let Some(command) = s.strip_prefix("exec:") {
            if command.trim().is_empty() {
                return Err(bad());
            }
            return Ok(SourceSpec::Exec(command.to_owned()));
        }
        if let Some(addr) = s.strip_prefix("rtp:") {
            return addr.parse().map(SourceSpec::Rtp).map_err(|_| bad());
        }
        Err(bad())
    }
}

/// One `[[video]]` table, or one `--video NAME=SOURCE`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VideoConfig {
    pub name: String,
    pub source: String,
}

/// A checked camera definition.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoSpec {
    pub name: String,
    pub source: SourceSpec,
}

impl FromStr for VideoSpec {
    type Err = VideoError;

    /// `NAME=SOURCE`, as given to `--video`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, source) = s.split_once('=').ok_or(VideoError::Spec(s.to_owned()))?;
        VideoSpec::new(name, source)
    }
}

impl VideoSpec {
    pub fn new(name: &str, source: &str) -> Result<VideoSpec, VideoError> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(VideoError::Name(name.to_owned()));
        }
        Ok(VideoSpec {
            name: name.to_owned(),
            source: source.parse()?,
        })
    }

    /// The file's cameras, then the flags' (a flag with a file camera's name
    /// replaces it).
    pub fn merge(file: &[VideoConfig], flags: &[VideoSpec]) -> Result<Vec<VideoSpec>, VideoError> {
        let mut out: Vec<VideoSpec> = Vec::new();
        for c in file {
            let spec = VideoSpec::new(&c.name, &c.source)?;
            if out.iter().any(|o| o.name == spec.name) {
                return Err(VideoError::Duplicate(spec.name));
            }
            out.push(spec);
        }
        for spec in flags {
            match out.iter_mut().find(|o| o.name == spec.name) {
                Some(existing) => *existing = spec.clone(),
                None => out.push(spec.clone()),
            }
        }
        Ok(out)
    }
}

/// A camera as reported to clients (`agent.capabilities` `meta.cameras`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CameraStatus {
    pub name: String,
    pub source: &'static str,
    pub codec: &'static str,
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Counters of one camera (the agent's metrics are its log; tests read them).
#[derive(Debug, Default)]
pub struct CameraStats {
    /// Pictures (exec) or packets (rtp) sent to the track.
    pub frames: AtomicU64,
    /// Source failures: start errors, exits, bad input, port in use.
    pub failures: AtomicU64,
    /// Input that was not H.264 (NAL units or RTP packets dropped).
    pub invalid_input: AtomicU64,
    /// PLI/FIR received from viewers.
    pub keyframe_requests: AtomicU64,
    /// IDR pictures sent with cached SPS/PPS put in front.
    pub params_inserted: AtomicU64,
    /// Times an exec source was started.
    pub starts: AtomicU64,
}

impl CameraStats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The track a source writes to.
#[derive(Clone)]
enum Track {
    Sample(Arc<TrackLocalStaticSample>),
    Rtp(Arc<TrackLocalStaticRTP>),
}

/// One camera: its track, its state, and its viewer count (which starts and
/// stops an `exec:` source).
pub struct Camera {
    name: String,
    source: SourceSpec,
    track: Track,
    error: Mutex<Option<String>>,
    users: watch::Sender<usize>,
    /// Availability changes, for the sessions already open.
    changes: broadcast::Sender<CameraStatus>,
    /// The source's latest keyframe, for a still picture (`still`).
    keyframes: watch::Sender<Option<still::Keyframe>>,
    pub stats: CameraStats,
}

impl std::fmt::Debug for Camera {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Camera")
            .field("name", &self.name)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn h264_codec() -> RTCRtpCodecCapability {
    RTCRtpCodecCapability {
        mime_type: MIME_TYPE_H264.to_owned(),
        clock_rate: 90_000,
        channels: 0,
        sdp_fmtp_line: "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f"
            .to_owned(),
        rtcp_feedback: vec![],
    }
}

impl Camera {
    /// Creates the camera and starts its source task (an `exec:` command
    /// waits for its first viewer; an `rtp:` socket is bound at once so a
    /// port in use shows before anyone asks).
    pub fn start(spec: VideoSpec, grace: Duration) -> Arc<Camera> {
        let track = match spec.source {
            SourceSpec::Exec(_) => Track::Sample(Arc::new(TrackLocalStaticSample::new(
                h264_codec(),
                spec.name.clone(),
                STREAM_ID.to_owned(),
            ))),
            SourceSpec::Rtp(_) => Track::Rtp(Arc::new(TrackLocalStaticRTP::new(
                h264_codec(),
                spec.name.clone(),
                STREAM_ID.to_owned(),
            ))),
        };
        let (users, _) = watch::channel(0);
        let (changes, _) = broadcast::channel(8);
        let camera = Arc::new(Camera {
            name: spec.name,
            source: spec.source.clone(),
            track,
            error: Mutex::new(None),
            users,
            changes,
            keyframes: watch::channel(None).0,
            stats: CameraStats::default(),
        });
        match spec.source {
            SourceSpec::Exec(command) => {
                tokio::spawn(exec::run(camera.clone(), command, grace));
            }
            SourceSpec::Rtp(addr) => {
                tokio::spawn(rtp::run(camera.clone(), addr));
            }
        }
        camera
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn track(&self) -> Arc<dyn TrackLocal + Send + Sync> {
        match &self.track {
            Track::Sample(t) => t.clone(),
            Track::Rtp(t) => t.clone(),
        }
    }

    pub fn status(&self) -> CameraStatus {
        let error = lock(&self.error).clone();
        CameraStatus {
            name: self.name.clone(),
            source: self.source.kind(),
            codec: "H264",
            available: error.is_none(),
            error,
        }
    }

    pub fn available(&self) -> bool {
        lock(&self.error).is_none()
    }

    /// A session starts watching.
    pub fn acquire(&self) {
        self.users.send_modify(|n| *n += 1);
    }

    /// A session stopped watching. When the last one leaves, the camera's
    /// counters go to the log (the agent's metrics are its log).
    pub fn release(&self) {
        self.users.send_modify(|n| *n = n.saturating_sub(1));
        if self.users() == 0 {
            let s = &self.stats;
            tracing::info!(
                camera = %self.name,
                frames_total = CameraStats::get(&s.frames),
                keyframe_requests_total = CameraStats::get(&s.keyframe_requests),
                params_inserted_total = CameraStats::get(&s.params_inserted),
                invalid_input_total = CameraStats::get(&s.invalid_input),
                failures_total = CameraStats::get(&s.failures),
                starts_total = CameraStats::get(&s.starts),
                "camera has no viewer"
            );
        }
    }

    /// Availability changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<CameraStatus> {
        self.changes.subscribe()
    }

    pub fn users(&self) -> usize {
        *self.users.borrow()
    }

    /// A viewer asked for a keyframe (PLI/FIR). No source can produce one
    /// on demand (see the module doc): counted, and the next IDR carries
    /// the parameter sets.
    pub fn keyframe_requested(&self) {
        CameraStats::add(&self.stats.keyframe_requests, 1);
    }

    /// Marks the source failed: logged once per change, counted.
    fn fail(&self, reason: String) {
        CameraStats::add(&self.stats.failures, 1);
        let changed = {
            let mut error = lock(&self.error);
            let changed = error.as_deref() != Some(reason.as_str());
            *error = Some(reason.clone());
            changed
        };
        if changed {
            tracing::warn!(camera = %self.name, source = self.source.kind(), %reason,
                failures_total = CameraStats::get(&self.stats.failures),
                "camera unavailable");
            // Nobody listening is fine.
            let _ = self.changes.send(self.status());
        }
    }

    /// The source delivers H.264 again.
    fn recovered(&self) {
        let was_failed = lock(&self.error).take().is_some();
        if was_failed {
            tracing::info!(camera = %self.name, "camera available again");
            let _ = self.changes.send(self.status());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(
            "front=exec:ffmpeg -f h264 -".parse::<VideoSpec>(),
            Ok(VideoSpec {
                name: "front".into(),
                source: SourceSpec::Exec("ffmpeg -f h264 -".into())
            })
        );
        assert_eq!(
            "rear=rtp:127.0.0.1:5004".parse::<VideoSpec>(),
            Ok(VideoSpec {
                name: "rear".into(),
                source: SourceSpec::Rtp("127.0.0.1:5004".parse().expect("addr"))
            })
        );
        assert!(matches!(
            "front".parse::<VideoSpec>(),
            Err(VideoError::Spec(_))
        ));
        assert!(matches!(
            "a b=rtp:127.0.0.1:1".parse::<VideoSpec>(),
            Err(VideoError::Name(_))
        ));
        for bad in [
            "x=rtp:localhost",
            "x=exec:",
            "x=file:/dev/video0",
            "x=rtp:1.2.3.4:99999",
        ] {
            assert!(
                matches!(bad.parse::<VideoSpec>(), Err(VideoError::Source(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn flags_add_to_and_replace_the_files_cameras() {
        let file = vec![
            VideoConfig {
                name: "front".into(),
                source: "rtp:127.0.0.1:5004".into(),
            },
            VideoConfig {
                name: "rear".into(),
                source: "exec:cam".into(),
            },
        ];
        let flags = vec![
            "rear=rtp:127.0.0.1:5006".parse().expect("spec"),
            "arm=exec:x".parse().expect("spec"),
        ];
        let merged = VideoSpec::merge(&file, &flags).expect("merge");
        let names: Vec<_> = merged
            .iter()
            .map(|s| (s.name.as_str(), s.source.kind()))
            .collect();
        assert_eq!(
            names,
            vec![("front", "rtp"), ("rear", "rtp"), ("arm", "exec")]
        );
        let twice = vec![file[0].clone(), file[0].clone()];
        assert_eq!(
            VideoSpec::merge(&twice, &[]),
            Err(VideoError::Duplicate("front".into()))
        );
    }
}
