//! Accepted sockets that hold no read buffer while idle.
//!
//! Most of the server's sockets are idle robots. The WebSocket layer reads through a small
//! buffer of its own (freed while idle: vendor/tungstenite) and fills it with one read per
//! call, so a read size big enough for a burst would cost memory and zero-filling on every
//! socket, and a small one costs system calls on busy ones. This stream sits below it: a
//! small read is served from a chunk lent by the worker thread, filled with whatever the
//! kernel has in one call, and the chunk goes back as soon as it is drained. Idle sockets
//! hold nothing; busy ones make one call per burst.

use std::cell::Cell;
use std::future::{ready, Ready};
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum_server::accept::Accept;

use crate::admission::{Admission, Permit};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Most bytes one system call reads.
const CHUNK: usize = 16 * 1024;

/// Reads asking for at least this much go straight to the kernel (HTTP requests do).
const DIRECT: usize = 4 * 1024;

thread_local! {
    /// One spare chunk per worker thread: a socket borrows it for a read and returns it
    /// when the bytes are handed out, so chunks are not allocated per read.
    static SPARE: Cell<Option<Vec<u8>>> = const { Cell::new(None) };
}

/// A chunk of `CHUNK` bytes (zeroed once, when first made: a lent chunk keeps its bytes).
fn borrow_chunk() -> Vec<u8> {
    SPARE.with(Cell::take).unwrap_or_else(|| vec![0; CHUNK])
}

fn return_chunk(chunk: Vec<u8>) {
    SPARE.with(|spare| {
        if let Some(kept) = spare.take() {
            // This thread already has one; keep it and drop the other.
            spare.set(Some(kept));
        } else {
            spare.set(Some(chunk));
        }
    });
}

/// A TCP stream whose read buffer exists only while read bytes wait in it.
pub struct LeanStream {
    inner: TcpStream,
    /// A chunk whose bytes in the range were read from the kernel and not yet handed out.
    pending: Option<(Vec<u8>, Range<usize>)>,
    /// Its place among the connections admitted (freed when the stream drops).
    _permit: Option<Permit>,
}

impl LeanStream {
    pub fn new(inner: TcpStream) -> LeanStream {
        LeanStream {
            inner,
            pending: None,
            _permit: None,
        }
    }

    /// Copies what fits of `read` into `out`; keeps the rest, or gives the chunk back when
    /// drained.
    fn hand_out(&mut self, chunk: Vec<u8>, read: Range<usize>, out: &mut ReadBuf<'_>) {
        let n = read.len().min(out.remaining());
        out.put_slice(&chunk[read.start..read.start + n]);
        if n == read.len() {
            return_chunk(chunk);
        } else {
            self.pending = Some((chunk, read.start + n..read.end));
        }
    }
}

impl AsyncRead for LeanStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if let Some((chunk, read)) = this.pending.take() {
            this.hand_out(chunk, read, out);
            return Poll::Ready(Ok(()));
        }
        if out.remaining() >= DIRECT {
            return Pin::new(&mut this.inner).poll_read(cx, out);
        }
        // Through the stream's own `poll_read`, not readiness and `try_read`: a read that
        // fills less than the chunk has drained the socket, and tokio then clears its
        // readiness, so the next poll waits for the kernel instead of making one more read
        // that finds nothing (one `recvfrom` answering EAGAIN per message, at light load).
        let mut chunk = borrow_chunk();
        let mut into = ReadBuf::new(&mut chunk);
        match Pin::new(&mut this.inner).poll_read(cx, &mut into) {
            Poll::Ready(Ok(())) => {
                let n = into.filled().len();
                // Zero bytes is the end of the stream: nothing handed out says so.
                this.hand_out(chunk, 0..n, out);
                Poll::Ready(Ok(()))
            }
            other => {
                return_chunk(chunk);
                other
            }
        }
    }
}

impl AsyncWrite for LeanStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Accepts sockets as lean streams, without Nagle delays (signalling messages are small
/// and latency-bound), within the TCP connection limits: a connection over them is closed
/// at once, before anything is read, so that silent connections from one source cannot
/// take every file descriptor (the time they may stay silent is bounded by the HTTP
/// layer's header deadline and the TLS handshake timeout, see `server`).
#[derive(Clone)]
pub struct LeanAcceptor {
    admission: Admission,
}

impl LeanAcceptor {
    pub fn new(admission: Admission) -> LeanAcceptor {
        LeanAcceptor { admission }
    }
}

impl<S> Accept<TcpStream, S> for LeanAcceptor {
    type Stream = LeanStream;
    type Service = S;
    type Future = Ready<io::Result<(LeanStream, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let admitted = stream
            .peer_addr()
            .and_then(|peer| {
                self.admission.admit(peer.ip()).map_err(|e| {
                    tracing::debug!(peer = %peer.ip(), error = %e, "TCP connection refused");
                    io::Error::other(e)
                })
            })
            .and_then(|permit| stream.set_nodelay(true).map(|()| permit));
        ready(admitted.map(|permit| {
            let mut lean = LeanStream::new(stream);
            lean._permit = Some(permit);
            (lean, service)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (LeanStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (LeanStream::new(accepted.unwrap().0), client.unwrap())
    }

    #[tokio::test]
    async fn small_reads_get_every_byte_in_order_and_the_chunk_goes_back() {
        let (mut lean, mut peer) = pair().await;
        let sent: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let writer = tokio::spawn(async move {
            peer.write_all(&sent).await.unwrap();
            sent
        });
        let mut got = Vec::new();
        let mut piece = [0u8; 1000];
        while got.len() < 50_000 {
            let n = lean.read(&mut piece).await.unwrap();
            assert!(n > 0, "early end of stream");
            got.extend_from_slice(&piece[..n]);
        }
        assert_eq!(got, writer.await.unwrap());
        assert!(lean.pending.is_none(), "a drained socket keeps no buffer");
    }

    #[tokio::test]
    async fn large_reads_go_direct_and_end_of_stream_reads_zero() {
        let (mut lean, mut peer) = pair().await;
        peer.write_all(b"hello").await.unwrap();
        peer.shutdown().await.unwrap();
        let mut big = vec![0u8; DIRECT];
        let n = lean.read(&mut big).await.unwrap();
        assert_eq!(&big[..n], b"hello");
        let mut small = [0u8; 16];
        assert_eq!(lean.read(&mut small).await.unwrap(), 0);
        assert!(lean.pending.is_none());
    }

    #[tokio::test]
    async fn writes_pass_through() {
        let (mut lean, mut peer) = pair().await;
        lean.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
    }
}
