//! Line framing on stdin/stdout: one JSON object per line each way. The
//! reader never holds more than the frame cap of one line (a longer line
//! is skipped and reported), so a runaway parent cannot grow our memory.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// One line read from the parent.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Text(String),
    /// Longer than the cap; its bytes were discarded.
    TooLong,
    NotUtf8,
}

pub struct LineReader<R> {
    inner: R,
    cap: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(inner: R, cap: usize) -> LineReader<R> {
        LineReader { inner, cap }
    }

    /// The next line without its `\n` (and `\r`); `None` at end of input.
    /// Cancel-safe only between lines: call it from one place.
    pub async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        let mut bytes: Vec<u8> = Vec::new();
        let mut too_long = false;
        let mut seen = false;
        loop {
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                // End of input: a last line without a newline still counts.
                if !seen {
                    return Ok(None);
                }
                break;
            }
            seen = true;
            let (chunk, used, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], i + 1, true),
                None => (buf, buf.len(), false),
            };
            if !too_long && bytes.len() + chunk.len() <= self.cap + 1 {
                bytes.extend_from_slice(chunk);
            } else {
                too_long = true;
                bytes = Vec::new();
            }
            self.inner.consume(used);
            if done {
                break;
            }
        }
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        if too_long || bytes.len() > self.cap {
            return Ok(Some(Line::TooLong));
        }
        Ok(Some(match String::from_utf8(bytes) {
            Ok(text) => Line::Text(text),
            Err(_) => Line::NotUtf8,
        }))
    }
}

/// Capacity of the queue of lines from the parent.
pub const IN_QUEUE: usize = 16;

/// Reads lines in a task of its own, so that the bridge's loop can wait
/// on them next to the socket without losing half a line (the reader is
/// not cancel-safe; a channel is). The channel closes at end of input,
/// after an `Err` if reading failed.
pub fn spawn_reader<R>(input: R, cap: usize) -> mpsc::Receiver<std::io::Result<Line>>
where
    R: AsyncBufRead + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(IN_QUEUE);
    tokio::spawn(async move {
        let mut reader = LineReader::new(input, cap);
        loop {
            let next = reader.next_line().await;
            let stop = !matches!(next, Ok(Some(_)));
            let item = match next {
                Ok(Some(line)) => Ok(line),
                Ok(None) => break,
                Err(e) => Err(e),
            };
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
    });
    rx
}

/// Capacity of the queue of lines to the parent.
pub const OUT_QUEUE: usize = 256;

/// Starts the one writer of stdout: every line goes through it, so lines
/// never interleave. It ends when every sender is dropped, or on a write
/// error (the parent went away).
pub fn spawn_writer<W>(mut out: W) -> (mpsc::Sender<String>, JoinHandle<std::io::Result<()>>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<String>(OUT_QUEUE);
    let task = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            out.write_all(line.as_bytes()).await?;
            out.write_all(b"\n").await?;
            out.flush().await?;
        }
        out.flush().await
    });
    (tx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_capped_and_checked() {
        let input: &[u8] = b"{\"a\":1}\r\n\nxxxxxxxxxxxx\n\xff\xfe\nlast";
        let mut r = LineReader::new(tokio::io::BufReader::with_capacity(4, input), 8);
        assert_eq!(
            r.next_line().await.unwrap(),
            Some(Line::Text("{\"a\":1}".into()))
        );
        assert_eq!(
            r.next_line().await.unwrap(),
            Some(Line::Text(String::new()))
        );
        assert_eq!(r.next_line().await.unwrap(), Some(Line::TooLong));
        assert_eq!(r.next_line().await.unwrap(), Some(Line::NotUtf8));
        assert_eq!(
            r.next_line().await.unwrap(),
            Some(Line::Text("last".into()))
        );
        assert_eq!(r.next_line().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_cap_passes() {
        let input: &[u8] = b"12345678\r\n123456789\n";
        let mut r = LineReader::new(input, 8);
        assert_eq!(
            r.next_line().await.unwrap(),
            Some(Line::Text("12345678".into()))
        );
        assert_eq!(r.next_line().await.unwrap(), Some(Line::TooLong));
    }
}
