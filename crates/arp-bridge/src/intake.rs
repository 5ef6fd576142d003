//! The parent's input, read once for either mode: each stdin line becomes
//! one JSON object, or the JSON-RPC error response the parent gets for it.

use serde_json::{Map, Value};
use signalling_protocol::arp::MAX_FRAME_BYTES;
use tokio::io::AsyncBufRead;
use tokio::sync::mpsc;

use crate::jsonrpc::{self, FrameError};
use crate::stdio::{self, Line};

/// One thing from stdin.
#[derive(Debug)]
pub enum Input {
    /// A JSON object, with its text as read (the relay forwards the text as is).
    Object {
        text: String,
        object: Map<String, Value>,
    },
    /// A line that is no JSON object: the error response to print for it.
    Refused(Value),
    /// A blank line: nothing to do.
    Blank,
    /// Reading stdin failed.
    Failed(std::io::Error),
    /// stdin ended.
    Ended,
}

/// stdin, read by a task of its own (lines capped at the ARP frame cap).
pub struct Intake {
    lines: mpsc::Receiver<std::io::Result<Line>>,
}

impl Intake {
    pub fn spawn<R>(input: R) -> Intake
    where
        R: AsyncBufRead + Unpin + Send + 'static,
    {
        Intake {
            lines: stdio::spawn_reader(input, MAX_FRAME_BYTES),
        }
    }

    /// The next input. Cancel-safe (it only waits on a channel), so the
    /// modes can wait on it beside the socket.
    pub async fn next(&mut self) -> Input {
        match self.lines.recv().await {
            None => Input::Ended,
            Some(Err(e)) => Input::Failed(e),
            Some(Ok(line)) => sort(line),
        }
    }
}

fn sort(line: Line) -> Input {
    let text = match line {
        Line::Text(text) => text,
        Line::TooLong => {
            return Input::Refused(FrameError::TooLarge(MAX_FRAME_BYTES).to_response())
        }
        Line::NotUtf8 => {
            return Input::Refused(FrameError::Parse("the line is not UTF-8".into()).to_response())
        }
    };
    if text.trim().is_empty() {
        return Input::Blank;
    }
    match jsonrpc::parse_object(&text) {
        Ok(object) => Input::Object { text, object },
        Err(e) => Input::Refused(e.to_response()),
    }
}
