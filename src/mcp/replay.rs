//! What a session sent on its SSE streams, kept for a client that lost a stream and asks
//! for the rest (`GET` with `Last-Event-ID`). Event ids are `<stream>-<sequence>`: stream 0
//! is the session's `GET` stream, each request answered by SSE has a stream of its own, and
//! the sequence counts the session's events. Bounded: the newest [`EVENTS`] events and
//! [`BYTES`] bytes of them (at least the newest one); older ones are gone for good.

use std::collections::VecDeque;

use super::registry::Event;

/// Events kept per session.
pub const EVENTS: usize = 256;
/// Bytes of messages kept per session (a camera frame is up to a few hundred KiB).
pub const BYTES: usize = 4 << 20;

/// A stream's events from a `Last-Event-ID`: which stream, and the sequence after which
/// to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub stream: u64,
    pub after: u64,
}

impl Cursor {
    /// `<stream>-<sequence>`, as [`Replay::record`] names events; `None` for anything else.
    pub fn parse(id: &str) -> Option<Cursor> {
        let (stream, after) = id.trim().split_once('-')?;
        Some(Cursor {
            stream: stream.parse().ok()?,
            after: after.parse().ok()?,
        })
    }
}

#[derive(Default)]
pub struct Replay {
    kept: VecDeque<(u64, u64, Event)>,
    bytes: usize,
    next: u64,
}

impl Replay {
    /// A new event with `line` on `stream`, kept (older ones dropped past the bounds).
    pub fn record(&mut self, stream: u64, line: String) -> Event {
        self.next += 1;
        let event = Event {
            id: format!("{stream}-{}", self.next),
            line,
        };
        self.bytes += event.line.len();
        self.kept.push_back((stream, self.next, event.clone()));
        while self.kept.len() > EVENTS || (self.bytes > BYTES && self.kept.len() > 1) {
            if let Some((_, _, old)) = self.kept.pop_front() {
                self.bytes -= old.line.len();
            }
        }
        event
    }

    /// The events kept of the cursor's stream after it, oldest first.
    pub fn after(&self, cursor: Cursor) -> impl Iterator<Item = &Event> {
        self.kept
            .iter()
            .filter(move |(stream, seq, _)| *stream == cursor.stream && *seq > cursor.after)
            .map(|(_, _, event)| event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_one_streams_events_after_the_cursor() {
        let mut replay = Replay::default();
        let first = replay.record(1, "a".into());
        replay.record(0, "b".into());
        replay.record(1, "c".into());
        let cursor = Cursor::parse(&first.id).expect("an id of ours");
        assert_eq!(
            cursor,
            Cursor {
                stream: 1,
                after: 1
            }
        );
        let lines: Vec<&str> = replay.after(cursor).map(|e| e.line.as_str()).collect();
        assert_eq!(lines, ["c"]);
        assert_eq!(Cursor::parse("x-1"), None);
        assert_eq!(Cursor::parse("7"), None);
    }

    #[test]
    fn keeps_at_most_the_bounds() {
        let mut replay = Replay::default();
        for i in 0..EVENTS + 10 {
            replay.record(0, i.to_string());
        }
        let all = Cursor {
            stream: 0,
            after: 0,
        };
        assert_eq!(replay.after(all).count(), EVENTS);
        assert_eq!(
            replay.after(all).next().map(|e| e.line.as_str()),
            Some("10")
        );
        // One event over the byte bound is still kept (it is the newest).
        replay.record(0, "x".repeat(BYTES + 1));
        assert_eq!(replay.after(all).count(), 1);
    }
}
