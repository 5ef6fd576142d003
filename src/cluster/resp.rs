//! The bus's own RESP2 (Redis's wire format) for the two things it does in bulk: PUBLISH
//! written from the relayed frames where they lie, and the replies and subscription pushes
//! read from one reused buffer. Profiles of cross-node 6 KB relaying put a third of each
//! node's time in the redis crate on this path (every frame copied three times on the way
//! out, each push parsed into a fresh buffer on the way in; docs/benchmarks.md, "Several
//! nodes"); the crate still does everything else.

use std::io::{IoSlice, Write};
use std::ops::Range;

use super::message::FrameOut;

/// A frame text shorter than this is copied next to its framing: one iovec for several
/// small frames costs less than an iovec each.
const COPY_BELOW: usize = 1024;
/// The longest bulk string read: far above any batch (64 KiB) or frame (`--max-frame-bytes`,
/// 64 KiB by default) the nodes send, so a damaged length cannot make the reader buffer
/// without end.
pub const MAX_BULK: usize = 64 * 1024 * 1024;
/// Longest `*`/`$`/`:` line read (with its end) before it is called damaged.
const MAX_LINE: usize = 64;
/// Longest status or error line read (with its end).
const MAX_TEXT_LINE: usize = 64 * 1024;

/// Commands for one write: their framing (and short payloads) in `head`, long frame texts
/// referenced where they are.
pub struct Outgoing<'a> {
    head: Vec<u8>,
    parts: Vec<Part<'a>>,
    /// Start of the part of `head` no part refers to yet.
    mark: usize,
    commands: usize,
}

enum Part<'a> {
    Head(Range<usize>),
    Text(&'a [u8]),
}

impl<'a> Outgoing<'a> {
    /// Reuses `head`'s allocation (cleared).
    pub fn new(mut head: Vec<u8>) -> Outgoing<'a> {
        head.clear();
        Outgoing {
            head,
            parts: Vec::new(),
            mark: 0,
            commands: 0,
        }
    }

    /// How many commands (so how many replies) it holds.
    pub fn commands(&self) -> usize {
        self.commands
    }

    /// Gives the framing buffer back for the next write.
    pub fn into_head(self) -> Vec<u8> {
        self.head
    }

    /// A command of plain arguments.
    pub fn command(&mut self, args: &[&[u8]]) {
        self.array(args.len());
        for arg in args {
            self.bulk_len(arg.len());
            self.head.extend_from_slice(arg);
            self.head.extend_from_slice(b"\r\n");
        }
        self.commands += 1;
    }

    /// `PUBLISH {channel} {frames}`: a lone frame as itself (`F…`), several as a batch
    /// (`B`, each frame's encoding behind its length, 4 bytes big-endian), the encodings of
    /// [`super::message::decode`].
    pub fn publish_frames(&mut self, channel: &[&[u8]], frames: &[&'a FrameOut]) {
        self.array(3);
        self.bulk_len(7);
        self.head.extend_from_slice(b"PUBLISH\r\n");
        self.bulk_len(channel.iter().map(|part| part.len()).sum());
        for part in channel {
            self.head.extend_from_slice(part);
        }
        self.head.extend_from_slice(b"\r\n");
        let batched = frames.len() != 1;
        let payload = frames
            .iter()
            .map(|f| f.encoded_len() + if batched { 4 } else { 0 })
            .sum::<usize>()
            + usize::from(batched);
        self.bulk_len(payload);
        if batched {
            self.head.push(b'B');
        }
        for frame in frames {
            if batched {
                // A frame is bounded by the socket's message limit, far below 4 GiB.
                let len = u32::try_from(frame.encoded_len()).unwrap_or(u32::MAX);
                self.head.extend_from_slice(&len.to_be_bytes());
            }
            self.head.push(b'F');
            if let Some(from) = &frame.from {
                self.head.extend_from_slice(from.as_bytes());
            }
            self.head.push(b'\n');
            self.head.extend_from_slice(frame.to.as_bytes());
            self.head.push(b'\n');
            self.head.extend_from_slice(frame.session.as_bytes());
            self.head.push(b'\n');
            self.text(frame.text.as_bytes());
        }
        self.head.extend_from_slice(b"\r\n");
        self.commands += 1;
    }

    fn text(&mut self, text: &'a [u8]) {
        if text.len() < COPY_BELOW {
            self.head.extend_from_slice(text);
            return;
        }
        if self.mark < self.head.len() {
            self.parts.push(Part::Head(self.mark..self.head.len()));
            self.mark = self.head.len();
        }
        self.parts.push(Part::Text(text));
    }

    fn array(&mut self, len: usize) {
        self.line(b'*', len);
    }

    fn bulk_len(&mut self, len: usize) {
        self.line(b'$', len);
    }

    fn line(&mut self, kind: u8, n: usize) {
        // Writing into a Vec cannot fail.
        let _ = write!(self.head, "{}{n}\r\n", char::from(kind));
    }

    /// Everything, in order, for a vectored write.
    pub fn io_slices(&self) -> Vec<IoSlice<'_>> {
        let mut slices = Vec::with_capacity(self.parts.len() + 1);
        for part in &self.parts {
            slices.push(IoSlice::new(match part {
                Part::Head(range) => &self.head[range.clone()],
                Part::Text(text) => text,
            }));
        }
        if self.mark < self.head.len() {
            slices.push(IoSlice::new(&self.head[self.mark..]));
        }
        slices
    }
}

/// One reply or push, borrowed from the read buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `+…`
    Status(&'a [u8]),
    /// `-…`
    Error(&'a [u8]),
    /// `:…`
    Integer(i64),
    /// `$…`; None for the null bulk string.
    Bulk(Option<&'a [u8]>),
    /// `*…` of flat items (all the bus reads: pushes and their confirmations).
    Array(Vec<Reply<'a>>),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("damaged reply from redis: {0}")]
pub struct RespError(pub(super) &'static str);

/// The reply at the start of `buf` and its length; None while it is incomplete.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply<'_>, usize)>, RespError> {
    parse_item(buf, 0, true)
}

fn parse_item(buf: &[u8], at: usize, nest: bool) -> Result<Option<(Reply<'_>, usize)>, RespError> {
    let Some((kind, line, mut end)) = read_line(buf, at)? else {
        return Ok(None);
    };
    let reply = match kind {
        b'+' => Reply::Status(line),
        b'-' => Reply::Error(line),
        b':' => Reply::Integer(number(line)?),
        b'$' => {
            let len = number(line)?;
            if len < 0 {
                Reply::Bulk(None)
            } else {
                let len = usize::try_from(len).map_err(|_| RespError("length"))?;
                if len > MAX_BULK {
                    return Err(RespError("bulk string too long"));
                }
                if buf.len() < end + len + 2 {
                    return Ok(None);
                }
                if &buf[end + len..end + len + 2] != b"\r\n" {
                    return Err(RespError("bulk string end"));
                }
                let bulk = &buf[end..end + len];
                end += len + 2;
                Reply::Bulk(Some(bulk))
            }
        }
        b'*' if nest => {
            let count = number(line)?;
            let count = usize::try_from(count.max(0)).map_err(|_| RespError("length"))?;
            if count > 16 {
                return Err(RespError("array too long"));
            }
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                let Some((item, next)) = parse_item(buf, end, false)? else {
                    return Ok(None);
                };
                items.push(item);
                end = next;
            }
            Reply::Array(items)
        }
        _ => return Err(RespError("unexpected type")),
    };
    Ok(Some((reply, end)))
}

/// A line's type byte, the rest of it and where the next line starts.
type Line<'a> = (u8, &'a [u8], usize);

fn read_line(buf: &[u8], at: usize) -> Result<Option<Line<'_>>, RespError> {
    let rest = &buf[at.min(buf.len())..];
    // A status or error line carries text; a header line only a number.
    let limit = match rest.first() {
        Some(b'+' | b'-') => MAX_TEXT_LINE,
        _ => MAX_LINE,
    };
    let window = &rest[..rest.len().min(limit)];
    match window.iter().position(|&b| b == b'\n') {
        Some(lf) => finish_line(rest, at, lf).map(Some),
        None if rest.len() >= limit => Err(RespError("line too long")),
        None => Ok(None),
    }
}

fn finish_line(rest: &[u8], at: usize, lf: usize) -> Result<Line<'_>, RespError> {
    if lf < 2 || rest[lf - 1] != b'\r' {
        return Err(RespError("line end"));
    }
    Ok((rest[0], &rest[1..lf - 1], at + lf + 1))
}

fn number(digits: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(RespError("number"))
}

#[cfg(test)]
mod tests {
    use axum::extract::ws::Utf8Bytes;

    use super::*;
    use crate::cluster::message::{decode, PeerMessage, RelayedFrame};
    use crate::delivery::ConnId;

    fn written(out: &Outgoing<'_>) -> Vec<u8> {
        out.io_slices().iter().flat_map(|s| s.to_vec()).collect()
    }

    fn frame(from: Option<&str>, to: &str, text: &str) -> FrameOut {
        FrameOut {
            from: from.map(ConnId::from),
            to: ConnId::from(to),
            session: format!("s-{to}").into(),
            text: Utf8Bytes::from(text.to_string()),
        }
    }

    /// Reads back what was written as a Redis server would: each command an array of bulk
    /// strings.
    fn commands(mut bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
        let mut commands = Vec::new();
        while !bytes.is_empty() {
            let (reply, used) = parse(bytes).unwrap().expect("complete");
            let Reply::Array(items) = reply else {
                panic!("an array")
            };
            commands.push(
                items
                    .into_iter()
                    .map(|item| match item {
                        Reply::Bulk(Some(b)) => b.to_vec(),
                        other => panic!("a bulk string, not {other:?}"),
                    })
                    .collect(),
            );
            bytes = &bytes[used..];
        }
        commands
    }

    #[test]
    fn publishes_carry_frames_short_and_long_in_order() {
        let long = format!("{{\"x\":\"{}\"}}", "a".repeat(6000));
        let frames = [
            frame(Some("c1"), "r1", "{\"a\":\"line\\nbreak\"}\n"),
            frame(None, "r2", ""),
            frame(Some("c3"), "r1", &long),
            frame(Some("c4"), "r9", "{}"),
        ];
        let refs: Vec<&FrameOut> = frames.iter().collect();
        let mut out = Outgoing::new(Vec::with_capacity(3));
        out.command(&[b"PUBLISH", b"p:all", b"J{}"]);
        out.publish_frames(&[b"p:", b"node:", b"n1"], &refs);
        out.publish_frames(&[b"p:node:n2"], &refs[2..3]);
        out.publish_frames(&[b"p:node:n3"], &refs[3..]);
        assert_eq!(out.commands(), 4);
        // The long frame is written from where it lies, not copied.
        assert!(out
            .io_slices()
            .iter()
            .any(|s| s.as_ptr() == frames[2].text.as_bytes().as_ptr()));

        let sent = commands(&written(&out));
        assert_eq!(sent.len(), 4);
        assert_eq!(sent[0], [&b"PUBLISH"[..], b"p:all", b"J{}"]);
        assert_eq!(sent[1][..2], [&b"PUBLISH"[..], b"p:node:n1"]);
        let expected = |fs: &[FrameOut]| {
            PeerMessage::Frames(
                fs.iter()
                    .map(|f| RelayedFrame {
                        from: f.from.clone(),
                        to: f.to.clone(),
                        session: f.session.to_string(),
                        text: f.text.as_str().into(),
                    })
                    .collect(),
            )
        };
        assert_eq!(decode(&sent[1][2]).unwrap(), expected(&frames));
        // A lone frame goes as itself.
        assert_eq!(sent[2][2][0], b'F');
        assert_eq!(decode(&sent[2][2]).unwrap(), expected(&frames[2..3]));
        assert_eq!(decode(&sent[3][2]).unwrap(), expected(&frames[3..]));

        // The framing buffer is handed back for reuse.
        let head = out.into_head();
        let mut again = Outgoing::new(head);
        assert_eq!(again.commands(), 0);
        again.command(&[b"PING"]);
        assert_eq!(written(&again), b"*1\r\n$4\r\nPING\r\n");
    }

    #[test]
    fn replies_and_pushes_parse_only_when_whole() {
        let stream: &[u8] = b":3\r\n+OK\r\n-ERR wrong\r\n$-1\r\n\
            *3\r\n$9\r\nsubscribe\r\n$4\r\np:n1\r\n:1\r\n\
            *3\r\n$7\r\nmessage\r\n$4\r\np:n1\r\n$6\r\nab\r\ncd\r\n";
        let expected = [
            Reply::Integer(3),
            Reply::Status(b"OK"),
            Reply::Error(b"ERR wrong"),
            Reply::Bulk(None),
            Reply::Array(vec![
                Reply::Bulk(Some(b"subscribe")),
                Reply::Bulk(Some(b"p:n1")),
                Reply::Integer(1),
            ]),
            Reply::Array(vec![
                Reply::Bulk(Some(b"message")),
                Reply::Bulk(Some(b"p:n1")),
                Reply::Bulk(Some(b"ab\r\ncd")),
            ]),
        ];
        let mut at = 0;
        for want in expected {
            // Every cut short of the whole reply reads as incomplete, never as another.
            let whole = (at..=stream.len())
                .find_map(|cut| parse(&stream[at..cut]).unwrap().map(|found| (found, cut)));
            let Some(((reply, used), cut)) = whole else {
                panic!("no reply at {at}");
            };
            assert_eq!(used, cut - at);
            assert_eq!(reply, want);
            at = cut;
        }
        assert_eq!(at, stream.len());
    }

    #[test]
    fn damaged_replies_are_refused() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$3\r\nabcd\r\n",
            b"$99999999999\r\n",
            b"*2\r\n*1\r\n:1\r\n:2\r\n",
            b"*17\r\n",
            b":1\n",
            b"$1111111111111111111111111111111111111111111111111111111111111111111111",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse(b"*3\r\n$7\r\nmessage\r\n$1").unwrap(), None);
        assert_eq!(parse(b"").unwrap(), None);
        // A long status line is still read.
        let long = format!("-ERR {}\r\n", "x".repeat(500));
        assert!(matches!(
            parse(long.as_bytes()).unwrap(),
            Some((Reply::Error(_), n)) if n == long.len()
        ));
    }
}
