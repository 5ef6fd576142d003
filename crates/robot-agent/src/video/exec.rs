//! `exec:COMMAND`: an H.264 Annex-B stream on a child's stdout.
//!
//! The command runs through `/bin/sh -c` while at least one session wants
//! video, and for a grace period after the last leaves. webrtc-media's
//! `H264Reader` (blocking) splits the stream into NAL units on a blocking
//! thread; pictures go to the shared `TrackLocalStaticSample`, timed by the
//! wall clock (a live source's pace is the truth). A command that exits, or
//! whose output is not H.264, is logged, counted, marks the camera
//! unavailable and is restarted with backoff while viewers remain.

use std::io::Read;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use webrtc::media::io::h264_reader::H264Reader;
use webrtc::media::Sample;

use super::h264::AccessUnits;
use super::{Camera, CameraStats, Track, RESTART_INITIAL, RESTART_MAX};
use crate::driver::RestartBackoff;

/// Bytes read without a single SPS before the stream is judged not H.264.
const MAX_BYTES_BEFORE_SPS: u64 = 4 * 1024 * 1024;
/// Read buffer of the NAL reader.
const READ_CAPACITY: usize = 64 * 1024;
/// NAL units queued between the reader thread and the track writer.
const NAL_QUEUE: usize = 256;
/// A command that ran this long is healthy: the next crash restarts fast.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);
/// A picture's duration when the previous one is too far back to say.
const DEFAULT_FRAME: Duration = Duration::from_millis(33);

/// Why one run of the command ended.
enum End {
    /// No viewer for the grace period: stopped on purpose.
    Idle,
    Failed(String),
}

pub(super) async fn run(camera: Arc<Camera>, command: String, grace: Duration) {
    let Track::Sample(track) = camera.track.clone() else {
        return;
    };
    let mut users = camera.users.subscribe();
    let mut backoff = RestartBackoff::new(RESTART_INITIAL, RESTART_MAX);
    loop {
        // Wait for a viewer (returns at once if one is there).
        if users.wait_for(|n| *n > 0).await.is_err() {
            return;
        }
        let started = tokio::time::Instant::now();
        match run_once(&camera, &track, &command, grace, &mut users).await {
            End::Idle => {
                tracing::info!(camera = %camera.name, "no viewer left; video source stopped");
                backoff.reset();
            }
            End::Failed(reason) => {
                camera.fail(reason);
                if started.elapsed() >= HEALTHY_AFTER {
                    backoff.reset();
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// Counts what the reader pulled from the pipe and refuses to go on when
/// megabytes pass without an SPS: a stream that is not H.264 would
/// otherwise be scanned for start codes forever.
struct Guard<R> {
    inner: R,
    read: u64,
    sps_seen: Arc<AtomicBool>,
}

impl<R: Read> Read for Guard<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.sps_seen.load(Ordering::Relaxed) && self.read > MAX_BYTES_BEFORE_SPS {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{MAX_BYTES_BEFORE_SPS} bytes without an H.264 SPS"),
            ));
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

async fn run_once(
    camera: &Camera,
    track: &webrtc::track::track_local::track_local_static_sample::TrackLocalStaticSample,
    command: &str,
    grace: Duration,
    users: &mut tokio::sync::watch::Receiver<usize>,
) -> End {
    let mut child = match start(camera, command) {
        Ok(child) => child,
        Err(end) => return end,
    };
    let stdout = match child.stdout.take().map(|s| s.into_owned_fd()) {
        Some(Ok(fd)) => std::fs::File::from(fd),
        _ => return End::Failed("the command's stdout is not a pipe".into()),
    };
    let sps_seen = Arc::new(AtomicBool::new(false));
    let mut nals = read_nals(stdout, sps_seen.clone());
    let mut units = AccessUnits::default();
    let mut last = tokio::time::Instant::now();
    let mut idle_since: Option<tokio::time::Instant> = None;
    let end = loop {
        let idle_deadline = idle_since.map(|at| at + grace);
        let idle = tokio::time::sleep_until(
            idle_deadline
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600)),
        );
        tokio::select! {
            item = nals.recv() => {
                let nal = match item {
                    Some(Ok(nal)) => nal,
                    Some(Err(None)) | None => break exit_reason(&mut child).await,
                    Some(Err(Some(e))) => {
                        CameraStats::add(&camera.stats.invalid_input, 1);
                        break End::Failed(format!("output is not an H.264 Annex-B stream: {e}"));
                    }
                };
                if nal.first().is_none_or(|h| h & 0x80 != 0) {
                    CameraStats::add(&camera.stats.invalid_input, 1);
                    if !units.seen_sps() {
                        break End::Failed("output is not an H.264 Annex-B stream (invalid NAL header)".into());
                    }
                    continue;
                }
                let picture = units.push(&nal);
                if units.seen_sps() && !sps_seen.swap(true, Ordering::Relaxed) {
                    camera.recovered();
                }
                let Some(data) = picture else { continue };
                if super::h264::is_keyframe(&data) {
                    camera.keyframe(data.clone());
                }
                let now = tokio::time::Instant::now();
                let mut duration = now.saturating_duration_since(last);
                if duration.is_zero() || duration > Duration::from_secs(1) {
                    duration = DEFAULT_FRAME;
                }
                last = now;
                if let Err(e) = track.write_sample(&Sample { data, duration, ..Default::default() }).await {
                    tracing::debug!(camera = %camera.name, error = %e, "writing a picture");
                }
                CameraStats::add(&camera.stats.frames, 1);
                camera.stats.params_inserted.store(units.params_inserted, Ordering::Relaxed);
            }
            changed = users.changed() => {
                if changed.is_err() {
                    break End::Idle;
                }
                let n = *users.borrow_and_update();
                idle_since = if n == 0 { Some(tokio::time::Instant::now()) } else { None };
            }
            () = idle, if idle_deadline.is_some() => break End::Idle,
        }
    };
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    end
}

/// Starts the source command, its stderr logged line by line.
fn start(camera: &Camera, command: &str) -> Result<tokio::process::Child, End> {
    let spawned = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return Err(End::Failed(format!("cannot start {command:?}: {e}"))),
    };
    CameraStats::add(&camera.stats.starts, 1);
    tracing::info!(camera = %camera.name, %command, pid = child.id(), "video source started");
    if let Some(stderr) = child.stderr.take() {
        let name = camera.name.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(camera = %name, "source: {line}");
            }
        });
    }
    Ok(child)
}

/// A NAL unit read, `Err(None)` at the end of the stream, `Err(Some(why))`
/// for bad input.
type Nal = Result<bytes::Bytes, Option<String>>;

/// Reads the command's output as NAL units on a blocking thread, which ends
/// on EOF (the child exited or was killed) or when the receiver is gone.
fn read_nals(stdout: std::fs::File, sps_seen: Arc<AtomicBool>) -> mpsc::Receiver<Nal> {
    let (nal_tx, nals) = mpsc::channel::<Nal>(NAL_QUEUE);
    tokio::task::spawn_blocking(move || {
        let guard = Guard {
            inner: stdout,
            read: 0,
            sps_seen,
        };
        let mut reader = H264Reader::new(guard, READ_CAPACITY);
        loop {
            let item = match reader.next_nal() {
                Ok(nal) => Ok(nal.data.freeze()),
                Err(webrtc::media::Error::ErrIoEOF) => Err(None),
                Err(e) => Err(Some(e.to_string())),
            };
            let stop = item.is_err();
            if nal_tx.blocking_send(item).is_err() || stop {
                return;
            }
        }
    });
    nals
}

async fn exit_reason(child: &mut tokio::process::Child) -> End {
    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(status)) => End::Failed(format!("the command exited ({status})")),
        Ok(Err(e)) => End::Failed(format!("the command failed: {e}")),
        Err(_) => End::Failed("the command closed its stdout".into()),
    }
}
