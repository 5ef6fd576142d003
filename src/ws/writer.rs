//! A socket's writer task: it sends the socket's queue, a batch per wake-up with one flush,
//! within the write timeout, and the close frame the reader asks for.

use std::future::Future;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::legacy;
use crate::config::SocketLimits;
pub use crate::relay::CloseRequest;
use crate::relay::{Mailbox, Outbound, QueueReceiver, WriterNext};

type Sink = SplitSink<WebSocket, Message>;

/// How long a socket the server closes waits for the peer's close frame.
const CLOSE_HANDSHAKE: Duration = Duration::from_secs(2);

/// Frames the writer sends before one flush.
const WRITE_BATCH: usize = 64;

/// Starts the socket's writer task, in the socket's span. The socket task asks it to end
/// through the queue's sender ([`Mailbox::end_writer`]).
pub(super) fn spawn_writer(
    sink: Sink,
    queue: QueueReceiver,
    limits: &SocketLimits,
) -> JoinHandle<()> {
    let writer = Writer {
        timeout_ms: u32::try_from(limits.write_timeout.as_millis()).unwrap_or(u32::MAX),
        queue_len: u32::try_from(limits.close_drain).unwrap_or(u32::MAX),
    };
    tokio::spawn(write_loop(sink, queue, writer).in_current_span())
}

/// How the socket ends once the reader is done and the writer still runs.
pub(super) struct Closing {
    /// The close frame the server sends, if it closes the socket.
    close: Option<CloseRequest>,
    /// The peer sent its close frame already.
    peer_closed: bool,
    write_timeout: Duration,
}

impl Closing {
    pub(super) fn new(
        close: Option<CloseRequest>,
        peer_closed: bool,
        write_timeout: Duration,
    ) -> Closing {
        Closing {
            close,
            peer_closed,
            write_timeout,
        }
    }

    /// `queue` is the sending side of the writer's queue.
    pub(super) async fn run(
        self,
        queue: &Mailbox,
        stream: &mut SplitStream<WebSocket>,
        writer: &mut JoinHandle<()>,
    ) {
        match self.close {
            Some(close) => {
                queue.end_writer(Some(close));
                if !self.peer_closed {
                    // Our close: wait (bounded) for the peer's, reading what it still
                    // sends. Dropping the socket with unread input makes the kernel answer
                    // with a reset, which can overtake the close frame on its way.
                    let handshake = async {
                        while let Some(Ok(frame)) = stream.next().await {
                            if matches!(frame, Message::Close(_)) {
                                break;
                            }
                        }
                    };
                    let _ = tokio::time::timeout(CLOSE_HANDSHAKE, handshake).await;
                }
            }
            None => queue.end_writer(None),
        }
        // The writer sends what is queued and the close frame within its write timeout.
        if tokio::time::timeout(self.write_timeout * 2, &mut *writer)
            .await
            .is_err()
        {
            writer.abort();
        }
    }
}

/// How a socket's writer works. Narrow fields: this is in every socket's writer task, and
/// 16 bytes fewer put that task in a smaller allocation.
struct Writer {
    /// Longest a batch of writes may take before the socket is given up, in ms.
    timeout_ms: u32,
    /// Most frames sent between a close request and the close frame.
    queue_len: u32,
}

impl Writer {
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.into())
    }

    /// The frame as this socket hears it (the queue knows the peer's dialect); None for a
    /// message its dialect has no word for.
    fn message(&self, queue: &QueueReceiver, frame: Outbound) -> Option<Message> {
        match frame {
            Outbound::Text(text) if queue.flat() => {
                legacy::render(&text).map(|flat| Message::Text(flat.into()))
            }
            Outbound::Text(text) => Some(Message::Text(text)),
            Outbound::Ping => Some(Message::Ping(Default::default())),
        }
    }
}

/// Sends queued frames, a batch per wake-up with one flush, until the queue closes, the
/// reader asks for the end, or a write makes no progress for the writer's timeout.
///
/// A block, not an `async fn` (see `serve`), and each batch with its timer goes on the heap
/// for as long as it is written: an idle socket's writer holds only what waits for work.
// Not an `async fn` on purpose: see the comment above.
#[allow(clippy::manual_async_fn)]
fn write_loop(
    mut sink: Sink,
    mut queue: QueueReceiver,
    writer: Writer,
) -> impl Future<Output = ()> + Send {
    async move {
        loop {
            let frame = match queue.next_for_writer().await {
                WriterNext::Frame(frame) => frame,
                WriterNext::End(Some((code, reason))) => {
                    // What was queued before the close goes out first, bounded in count
                    // and time: peers may keep queueing, the close must not wait on them.
                    let closing = async {
                        for _ in 0..writer.queue_len {
                            let Some(frame) = queue.try_recv() else { break };
                            if let Some(message) = writer.message(&queue, frame) {
                                sink.feed(message).await?;
                            }
                        }
                        let reason = Utf8Bytes::from(reason.into_owned());
                        sink.send(Message::Close(Some(CloseFrame { code, reason })))
                            .await?;
                        sink.close().await
                    };
                    let _ = Box::pin(tokio::time::timeout(writer.timeout(), closing)).await;
                    return;
                }
                WriterNext::End(None) | WriterNext::Closed => return,
            };
            let batch = async {
                if let Some(message) = writer.message(&queue, frame) {
                    sink.feed(message).await?;
                }
                for _ in 1..WRITE_BATCH {
                    let Some(frame) = queue.try_recv() else { break };
                    if let Some(message) = writer.message(&queue, frame) {
                        sink.feed(message).await?;
                    }
                }
                sink.flush().await
            };
            match Box::pin(tokio::time::timeout(writer.timeout(), batch)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "socket write failed");
                    return;
                }
                Err(_) => {
                    tracing::info!(
                        timeout_secs = writer.timeout().as_secs(),
                        "socket write timed out; closing"
                    );
                    return;
                }
            }
        }
    }
}
