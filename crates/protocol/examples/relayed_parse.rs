//! How long the relay's one-pass view takes to read an SDP answer of about 6 KB: the bench's
//! synthetic SDP (one escape, then padding) and an SDP-like one (80 lines, each ending in an
//! escaped `\r\n`). Prints nanoseconds per message.
//!
//!     cargo run --release -p signalling-protocol --example relayed_parse [ITERATIONS]

use std::hint::black_box;
use std::time::Instant;

use signalling_protocol::Relayed;

fn answer(sdp: &str) -> String {
    format!(
        r#"{{"type":"signalling.answer","version":"0.5","id":"00000000000000012345","timestamp":"2026-01-01T00:00:00Z","payload":{{"connectionId":"c1","sdpType":"answer","sdp":"{sdp}"}}}}"#
    )
}

fn main() {
    let iterations: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(200_000);
    let synthetic = answer(&format!("v=0\\r\\n{}", "x".repeat(6000)));
    let lines: String = (0..80)
        .map(|i| {
            format!("a=candidate:{i} 1 udp 2122260223 192.168.1.{i} 5{i:04} typ host generation 0\\r\\n")
        })
        .collect();
    let sdp_like = answer(&lines);
    for (name, text) in [("synthetic", &synthetic), ("sdp-like", &sdp_like)] {
        assert!(
            Relayed::parse(text).is_some(),
            "{name} must take the fast path"
        );
        let start = Instant::now();
        for _ in 0..iterations {
            black_box(Relayed::parse(black_box(text)));
        }
        let per = start.elapsed().as_nanos() / u128::from(iterations);
        println!("{name:>9}: {} bytes, {per} ns per message", text.len());
    }
}
