//! `capture_image`: one frame of what the robot sees, as JPEG. A robot with a camera
//! (`[[video]]`, `--video`) shows its first camera's picture (`crate::video::still`: the
//! source's latest keyframe decoded by ffmpeg, at most 640×480). The sim and the test-pattern
//! source have no camera, so the frame is synthetic: colour bars with a marker that follows
//! the pose (x moves it across, the heading down), so a model sees the robot move: 320×240, a
//! few kilobytes. Either way at most [`CAPTURES_PER_SECOND`] a second per robot.
//!
//! The encoder is baseline JPEG reduced to what the pattern needs: every 8×8 block is one
//! flat colour, so each block is its DC coefficient alone (quantised by 1) and an
//! end-of-block; YCbCr 4:4:4, one Huffman table for DC (the standard luminance one) and one
//! for AC (only end-of-block). Any decoder reads it.

use std::time::{Duration, Instant};

use crate::driver::Pose;

pub const WIDTH: usize = 320;
pub const HEIGHT: usize = 240;
pub const CAPTURES_PER_SECOND: u32 = 5;
/// The decoder of a camera's keyframe, found on the PATH.
pub const FFMPEG: &str = "ffmpeg";
/// Shortest time between two captures.
pub const CAPTURE_EVERY: Duration = Duration::from_millis(1000 / CAPTURES_PER_SECOND as u64);

/// The last capture, for the rate bound.
#[derive(Debug, Default)]
pub struct Shutter {
    last: Option<Instant>,
}

impl Shutter {
    /// Whether a capture may happen now (and, if so, it counts).
    pub fn allow(&mut self, now: Instant) -> bool {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < CAPTURE_EVERY)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// Colour bars (white, yellow, cyan, green, magenta, red, blue, black).
const BARS: [[u8; 3]; 8] = [
    [235, 235, 235],
    [235, 235, 16],
    [16, 235, 235],
    [16, 235, 16],
    [235, 16, 235],
    [235, 16, 16],
    [16, 16, 235],
    [16, 16, 16],
];

/// The test pattern for `pose` (none: no marker), as one RGB colour per 8×8 block.
pub fn pattern(pose: Option<Pose>) -> Vec<[u8; 3]> {
    let (bw, bh) = (WIDTH / 8, HEIGHT / 8);
    let mut blocks = Vec::with_capacity(bw * bh);
    // The marker: 2×2 blocks; x in [-5, 5) m across, the heading down.
    let marker = pose.map(|p| {
        let across = ((p.x + 5.0) / 10.0).clamp(0.0, 1.0);
        let turn = (p.theta.rem_euclid(std::f64::consts::TAU)) / std::f64::consts::TAU;
        let col = (across * (bw - 2) as f64).round() as usize;
        let row = (turn * (bh - 2) as f64).round() as usize;
        (col, row)
    });
    for row in 0..bh {
        for col in 0..bw {
            let on_marker =
                marker.is_some_and(|(c, r)| (c..c + 2).contains(&col) && (r..r + 2).contains(&row));
            blocks.push(if on_marker {
                [255, 128, 0]
            } else {
                BARS[col * BARS.len() / bw]
            });
        }
    }
    blocks
}

/// The pattern as a JPEG file.
pub fn jpeg(pose: Option<Pose>) -> Vec<u8> {
    encode(WIDTH, HEIGHT, &pattern(pose))
}

/// A baseline JPEG of `width`×`height` (multiples of 8) made of flat 8×8 blocks, one RGB
/// colour each, row by row.
pub fn encode(width: usize, height: usize, blocks: &[[u8; 3]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(&[0xFF, 0xD8]);
    // APP0 JFIF 1.1, no density, no thumbnail.
    out.extend_from_slice(&[
        0xFF, 0xE0, 0, 16, b'J', b'F', b'I', b'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0,
    ]);
    // DQT: table 0, all ones.
    out.extend_from_slice(&[0xFF, 0xDB, 0, 67, 0]);
    out.extend_from_slice(&[1; 64]);
    // SOF0: 8 bits, the size, three components sampled 1×1 on table 0.
    let (w, h) = (width as u16, height as u16);
    out.extend_from_slice(&[0xFF, 0xC0, 0, 17, 8]);
    out.extend_from_slice(&h.to_be_bytes());
    out.extend_from_slice(&w.to_be_bytes());
    out.extend_from_slice(&[3, 1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0]);
    // DHT: DC table 0 (standard luminance), AC table 0 (end-of-block only).
    out.extend_from_slice(&[0xFF, 0xC4]);
    let length = 2 + (1 + 16 + DC_VALUES.len()) + (1 + 16 + 1);
    out.extend_from_slice(&(length as u16).to_be_bytes());
    out.push(0x00);
    out.extend_from_slice(&DC_COUNTS);
    out.extend_from_slice(&DC_VALUES);
    out.push(0x10);
    let mut ac_counts = [0u8; 16];
    ac_counts[0] = 1;
    out.extend_from_slice(&ac_counts);
    out.push(0x00);
    // SOS: the three components, DC 0 / AC 0, full spectrum.
    out.extend_from_slice(&[0xFF, 0xDA, 0, 12, 3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0]);
    let dc_codes = canonical_codes(&DC_COUNTS);
    let mut bits = BitWriter::new(&mut out);
    let mut previous = [0i32; 3];
    for rgb in blocks.iter().take((width / 8) * (height / 8)) {
        for (component, level) in ycbcr(*rgb).into_iter().enumerate() {
            // A flat block's DC coefficient: 8 × (level − 128); quantised by 1.
            let dc = 8 * (level - 128);
            let diff = dc - previous[component];
            previous[component] = dc;
            let category = category(diff);
            let (code, length) = dc_codes[category as usize];
            bits.put(code, length);
            if category > 0 {
                let value = if diff < 0 { diff - 1 } else { diff };
                bits.put((value as u32) & ((1 << category) - 1), category);
            }
            // End of block: AC table 0's one code, `0`.
            bits.put(0, 1);
        }
    }
    bits.flush();
    out.extend_from_slice(&[0xFF, 0xD9]);
    out
}

/// The standard DC luminance table (ITU T.81, K.3): code counts by length, then values.
const DC_COUNTS: [u8; 16] = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0];
const DC_VALUES: [u8; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];

/// (code, length) of each value in order, from the counts (ITU T.81, C.2).
fn canonical_codes(counts: &[u8; 16]) -> Vec<(u32, u32)> {
    let mut codes = Vec::new();
    let mut code = 0u32;
    for (i, &n) in counts.iter().enumerate() {
        for _ in 0..n {
            codes.push((code, i as u32 + 1));
            code += 1;
        }
        code <<= 1;
    }
    codes
}

fn category(value: i32) -> u32 {
    32 - value.unsigned_abs().leading_zeros()
}

fn ycbcr([r, g, b]: [u8; 3]) -> [i32; 3] {
    let (r, g, b) = (f64::from(r), f64::from(g), f64::from(b));
    let y = 0.299 * r + 0.587 * g + 0.114 * b;
    let cb = 128.0 - 0.168_736 * r - 0.331_264 * g + 0.5 * b;
    let cr = 128.0 + 0.5 * r - 0.418_688 * g - 0.081_312 * b;
    [y, cb, cr].map(|v| v.round().clamp(0.0, 255.0) as i32)
}

/// Entropy-coded bits, most significant first, with 0xFF stuffed by 0x00.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u32,
    count: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter {
            out,
            acc: 0,
            count: 0,
        }
    }

    fn put(&mut self, bits: u32, length: u32) {
        for i in (0..length).rev() {
            self.acc = (self.acc << 1) | ((bits >> i) & 1);
            self.count += 1;
            if self.count == 8 {
                self.byte();
            }
        }
    }

    fn byte(&mut self) {
        let byte = self.acc as u8;
        self.out.push(byte);
        if byte == 0xFF {
            self.out.push(0x00);
        }
        self.acc = 0;
        self.count = 0;
    }

    /// Pads the last byte with ones.
    fn flush(&mut self) {
        if self.count > 0 {
            let pad = 8 - self.count;
            self.put((1 << pad) - 1, pad);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_a_small_jpeg_and_follows_the_pose() {
        let still = jpeg(None);
        assert_eq!(&still[..2], &[0xFF, 0xD8]);
        assert_eq!(&still[still.len() - 2..], &[0xFF, 0xD9]);
        assert!(still.len() < 8 * 1024, "{} bytes", still.len());
        let here = jpeg(Some(Pose {
            x: 0.0,
            y: 0.0,
            theta: 0.0,
        }));
        let there = jpeg(Some(Pose {
            x: 2.0,
            y: 0.0,
            theta: 1.0,
        }));
        assert_ne!(here, there);
        // DC categories: 0 (no change) to 11.
        assert_eq!(category(0), 0);
        assert_eq!(category(-1), 1);
        assert_eq!(category(1016), 10);
        assert_eq!(category(-1024), 11);
        assert_eq!(canonical_codes(&DC_COUNTS)[0], (0b00, 2));
        assert_eq!(canonical_codes(&DC_COUNTS)[11], (0b1_1111_1110, 9));
    }

    #[test]
    fn the_shutter_bounds_the_rate() {
        let mut shutter = Shutter::default();
        let now = Instant::now();
        assert!(shutter.allow(now));
        assert!(!shutter.allow(now + CAPTURE_EVERY / 2));
        assert!(shutter.allow(now + CAPTURE_EVERY));
    }
}
