//! One still picture of a camera, as JPEG (ARP's `capture_image`): the source's latest
//! keyframe (an IDR access unit with its SPS/PPS, kept by the source task), decoded by
//! `ffmpeg` (found on the PATH) and scaled to fit
//! [`MAX_WIDTH`]×[`MAX_HEIGHT`]. A keyframe older than [`FRESH`] is not shown: the camera
//! is watched (an `exec:` source started if it was not running) until the next one comes,
//! [`KEYFRAME_WAIT`] at most; keep the source's keyframe interval short (`-g 30`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::Camera;

/// Largest picture returned; a larger source is scaled down (aspect kept).
pub const MAX_WIDTH: u32 = 640;
pub const MAX_HEIGHT: u32 = 480;
/// Largest JPEG returned.
pub const MAX_JPEG_BYTES: usize = 512 * 1024;
/// A keyframe at most this old is the picture now.
pub const FRESH: Duration = Duration::from_secs(2);
/// How long a capture waits for the source's next keyframe.
pub const KEYFRAME_WAIT: Duration = Duration::from_secs(5);
/// How long the decoder may take.
const DECODE_WAIT: Duration = Duration::from_secs(5);

/// The latest keyframe of a source and when it came.
#[derive(Debug, Clone)]
pub struct Keyframe {
    pub at: Instant,
    pub data: Bytes,
}

/// A decoded picture.
#[derive(Debug, Clone, PartialEq)]
pub struct Still {
    pub jpeg: Vec<u8>,
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum StillError {
    #[error("camera {camera} sent no keyframe within {} s", KEYFRAME_WAIT.as_secs())]
    NoKeyframe { camera: String },
    #[error("cannot run the decoder {program:?}: {reason}")]
    Decoder { program: String, reason: String },
    #[error("the decoder gave no picture: {0}")]
    Decode(String),
    #[error("the picture is over {MAX_JPEG_BYTES} bytes")]
    TooLarge,
}

impl Camera {
    /// The camera's picture now: its latest keyframe if fresh, else the next one.
    pub async fn still(&self, ffmpeg: &str) -> Result<Still, StillError> {
        let keyframe = self.fresh_keyframe().await?;
        decode(ffmpeg, keyframe.data).await
    }

    async fn fresh_keyframe(&self) -> Result<Keyframe, StillError> {
        let since = Instant::now().checked_sub(FRESH);
        let fresh = |k: &Option<Keyframe>| {
            k.as_ref()
                .is_some_and(|k| since.is_none_or(|since| k.at >= since))
        };
        let mut keyframes = self.keyframes.subscribe();
        let latest = keyframes.borrow_and_update().clone();
        if let Some(k) = latest.filter(|k| fresh(&Some(k.clone()))) {
            return Ok(k);
        }
        // Watched while waiting: an `exec:` source runs only for someone.
        self.acquire();
        let next = tokio::time::timeout(KEYFRAME_WAIT, keyframes.wait_for(fresh)).await;
        self.release();
        match next {
            Ok(Ok(k)) => k.clone().ok_or_else(|| self.no_keyframe()),
            _ => Err(self.no_keyframe()),
        }
    }

    fn no_keyframe(&self) -> StillError {
        StillError::NoKeyframe {
            camera: self.name.clone(),
        }
    }

    /// A source task's new keyframe.
    pub(super) fn keyframe(&self, data: Bytes) {
        self.keyframes.send_replace(Some(Keyframe {
            at: Instant::now(),
            data,
        }));
    }
}

/// `keyframe` (H.264 Annex-B) decoded by `ffmpeg` into one JPEG, scaled to fit the bounds.
pub async fn decode(ffmpeg: &str, keyframe: Bytes) -> Result<Still, StillError> {
    let scale = format!(
        "scale=w='min({MAX_WIDTH},iw)':h='min({MAX_HEIGHT},ih)':force_original_aspect_ratio=decrease"
    );
    let spawned = Command::new(ffmpeg)
        .args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-f",
            "h264",
            "-i",
            "pipe:0",
        ])
        .args(["-frames:v", "1", "-vf", &scale, "-q:v", "5"])
        .args(["-f", "image2pipe", "-c:v", "mjpeg", "pipe:1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = spawned.map_err(|e| StillError::Decoder {
        program: ffmpeg.into(),
        reason: e.to_string(),
    })?;
    let (Some(mut stdin), Some(stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(StillError::Decode("no pipes to the decoder".into()));
    };
    let feed = async move {
        // The decoder may stop reading once it has its picture: a broken pipe is fine.
        let _ = stdin.write_all(&keyframe).await;
        drop(stdin);
    };
    let read = async {
        let mut jpeg = Vec::new();
        // One byte over the bound tells a picture too large.
        let mut limited = stdout.take(MAX_JPEG_BYTES as u64 + 1);
        limited.read_to_end(&mut jpeg).await.map(|_| jpeg)
    };
    let errors = async {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    };
    let run = async { tokio::join!(feed, read, errors, child.wait()) };
    let Ok(((), jpeg, errors, status)) = tokio::time::timeout(DECODE_WAIT, run).await else {
        return Err(StillError::Decode(format!(
            "no picture within {} s",
            DECODE_WAIT.as_secs()
        )));
    };
    let jpeg = jpeg.map_err(|e| StillError::Decode(e.to_string()))?;
    if jpeg.len() > MAX_JPEG_BYTES {
        return Err(StillError::TooLarge);
    }
    let failed = !status.as_ref().is_ok_and(|s| s.success());
    let Some((width, height)) = jpeg_size(&jpeg).filter(|_| !failed) else {
        let why = errors.trim();
        return Err(StillError::Decode(if why.is_empty() {
            format!("{status:?}")
        } else {
            why.chars().take(300).collect()
        }));
    };
    Ok(Still {
        jpeg,
        width,
        height,
    })
}

/// A JPEG's size, from its first start-of-frame marker.
pub fn jpeg_size(jpeg: &[u8]) -> Option<(u32, u32)> {
    if jpeg.get(..2)? != [0xFF, 0xD8] {
        return None;
    }
    let mut at = 2;
    loop {
        let (&marker_start, &marker) = (jpeg.get(at)?, jpeg.get(at + 1)?);
        if marker_start != 0xFF {
            return None;
        }
        let length = usize::from(u16::from_be_bytes([*jpeg.get(at + 2)?, *jpeg.get(at + 3)?]));
        // SOF0..SOF15 but DHT (C4), JPG (C8) and DAC (CC).
        if (0xC0..=0xCF).contains(&marker) && !matches!(marker, 0xC4 | 0xC8 | 0xCC) {
            let h = u16::from_be_bytes([*jpeg.get(at + 5)?, *jpeg.get(at + 6)?]);
            let w = u16::from_be_bytes([*jpeg.get(at + 7)?, *jpeg.get(at + 8)?]);
            return Some((u32::from(w), u32::from(h)));
        }
        at += 2 + length;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_size_of_a_jpeg() {
        let jpeg = crate::arp::camera::jpeg(None);
        assert_eq!(jpeg_size(&jpeg), Some((320, 240)));
        assert_eq!(jpeg_size(b"not a jpeg"), None);
        assert_eq!(jpeg_size(&jpeg[..30]), None);
    }
}
