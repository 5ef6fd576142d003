//! The patched WebSocket codec (vendor/tungstenite, PATCHES.md) with the server's settings:
//! buffers released whenever a socket runs dry and a 512-byte read size. Every message must
//! still arrive whole, whatever the sizes and however the bytes are split across reads and
//! writes. The stream here is scripted: it hands out bytes in given pieces and answers
//! `WouldBlock` between them, as a socket with nothing more to read does, so each pause is
//! a point where the codec frees its buffers.

use std::collections::VecDeque;
use std::io::{self, Read, Write};

use tungstenite::protocol::frame::release_idle_buffers;
use tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
use tungstenite::{Error, Message};

/// Message sizes around every boundary the codec has: the 7-bit, 16-bit and 64-bit length
/// forms, the 14-byte header room, the 512-byte read size, and several reads' worth.
const SIZES: [usize; 14] = [
    0, 1, 13, 14, 15, 125, 126, 511, 512, 513, 6_000, 65_535, 65_536, 200_000,
];

fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(512)
        .write_buffer_size(16 * 1024)
}

/// Reads come from `pieces`, one piece at most per read, with a `WouldBlock` before each
/// new piece; writes are taken `write_limit` bytes at a time, with a `WouldBlock` after
/// each if `pause_writes`.
struct Scripted {
    pieces: VecDeque<Vec<u8>>,
    current: Vec<u8>,
    at: usize,
    paused: bool,
    written: Vec<u8>,
    write_limit: usize,
    /// Whether writes pause (answer `WouldBlock`) every other call.
    pause_writes: bool,
    write_paused: bool,
}

impl Scripted {
    fn reading(pieces: Vec<Vec<u8>>) -> Scripted {
        Scripted {
            pieces: pieces.into(),
            current: Vec::new(),
            at: 0,
            paused: false,
            written: Vec::new(),
            write_limit: usize::MAX,
            pause_writes: false,
            write_paused: false,
        }
    }

    fn drained(&self) -> bool {
        self.at == self.current.len() && self.pieces.is_empty()
    }
}

impl Read for Scripted {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.at == self.current.len() {
            if !self.paused {
                self.paused = true;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.paused = false;
            match self.pieces.pop_front() {
                Some(piece) => {
                    self.current = piece;
                    self.at = 0;
                }
                None => return Err(io::ErrorKind::WouldBlock.into()),
            }
        }
        let n = out.len().min(self.current.len() - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Scripted {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.write_paused {
            self.write_paused = false;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.write_paused = self.pause_writes;
        let n = bytes.len().min(self.write_limit);
        self.written.extend_from_slice(&bytes[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Text of `size` bytes that differs from message to message.
fn text(size: usize, seed: usize) -> String {
    (0..size)
        .map(|i| char::from(b'a' + ((i * 7 + seed * 13) % 26) as u8))
        .collect()
}

/// The bytes a browser would send for `messages` (masked client frames).
fn client_bytes(messages: &[String]) -> Vec<u8> {
    let mut client = WebSocket::from_raw_socket(Scripted::reading(Vec::new()), Role::Client, None);
    for message in messages {
        client.send(Message::text(message.clone())).unwrap();
    }
    std::mem::take(&mut client.get_mut().written)
}

/// Splits `bytes` into pieces whose lengths cycle through `lengths`.
fn split(bytes: &[u8], lengths: &[usize]) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let mut at = 0;
    for length in lengths.iter().cycle() {
        if at == bytes.len() {
            break;
        }
        let end = (at + length).min(bytes.len());
        pieces.push(bytes[at..end].to_vec());
        at = end;
    }
    pieces
}

/// Reads every message the server side gets from `pieces`.
fn server_reads(pieces: Vec<Vec<u8>>, expected: usize) -> Vec<String> {
    let mut server =
        WebSocket::from_raw_socket(Scripted::reading(pieces), Role::Server, Some(config()));
    let mut got = Vec::new();
    let mut idle_in_a_row = 0;
    while got.len() < expected {
        match server.read() {
            Ok(Message::Text(text)) => {
                got.push(text.as_str().to_owned());
                idle_in_a_row = 0;
            }
            Ok(other) => panic!("unexpected message {other:?}"),
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                idle_in_a_row += 1;
                // The script answers one `WouldBlock` between pieces; two in a row with
                // nothing left means the codec wants bytes that were already handed over.
                assert!(
                    idle_in_a_row < 2 || !server.get_ref().drained(),
                    "input ran out after {} of {expected} messages",
                    got.len()
                );
            }
            Err(e) => panic!("read failed: {e}"),
        }
    }
    got
}

#[test]
fn messages_arrive_whole_however_the_bytes_are_split() {
    release_idle_buffers(true);
    let messages: Vec<String> = SIZES
        .iter()
        .enumerate()
        .map(|(i, size)| text(*size, i))
        .collect();
    let bytes = client_bytes(&messages);
    // Whole, in single bytes around the headers, in odd sizes that straddle every boundary,
    // and in pieces larger than the read size.
    let splits: [&[usize]; 5] = [
        &[bytes.len()],
        &[1],
        &[3, 511, 7, 1024, 13, 6_001],
        &[2, 14, 126, 512, 513],
        &[16 * 1024],
    ];
    for lengths in splits {
        let got = server_reads(split(&bytes, lengths), messages.len());
        assert_eq!(got.len(), messages.len(), "split {lengths:?}");
        for (i, (got, sent)) in got.iter().zip(&messages).enumerate() {
            assert!(
                got == sent,
                "message {i} ({} bytes) changed, split {lengths:?}",
                sent.len()
            );
        }
    }
}

#[test]
fn messages_written_in_pieces_arrive_whole() {
    release_idle_buffers(true);
    for write_limit in [1, 100, 513, 7_000, usize::MAX] {
        let mut stream = Scripted::reading(Vec::new());
        stream.write_limit = write_limit;
        stream.pause_writes = true;
        let mut server = WebSocket::from_raw_socket(stream, Role::Server, Some(config()));
        let messages: Vec<String> = SIZES
            .iter()
            .enumerate()
            .map(|(i, size)| text(*size, i + 1))
            .collect();
        for message in &messages {
            // Queue, then flush until everything is out, as the writer task does per batch.
            let mut queued = server.write(Message::text(message.clone()));
            loop {
                match queued {
                    Ok(()) => break,
                    Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                        queued = server.flush();
                    }
                    Err(e) => panic!("write failed: {e}"),
                }
            }
            loop {
                match server.flush() {
                    Ok(()) => break,
                    Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => panic!("flush failed: {e}"),
                }
            }
        }
        let written = std::mem::take(&mut server.get_mut().written);
        let mut client =
            WebSocket::from_raw_socket(Scripted::reading(vec![written]), Role::Client, None);
        for (i, sent) in messages.iter().enumerate() {
            let got = loop {
                match client.read() {
                    Ok(Message::Text(text)) => break text,
                    Ok(other) => panic!("unexpected message {other:?}"),
                    Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => panic!("read failed: {e}"),
                }
            };
            assert!(
                got.as_str() == sent,
                "message {i} ({} bytes) changed, write limit {write_limit}",
                sent.len()
            );
        }
    }
}
