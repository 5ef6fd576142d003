//! The accept loop: HTTP/1.1 on every accepted connection, within its deadlines, and a
//! graceful stop.
//!
//! Not axum_server's loop, whose protocol detection (HTTP/1 or HTTP/2) reads a connection's
//! first bytes with no deadline at all: a connection that sent nothing, or part of the
//! HTTP/2 preface, or went silent after its TLS handshake, stayed open for ever. hyper's
//! HTTP/1 server starts the header deadline at its first read of each request, so here a
//! connection is never silent for longer than that: before its first request, between
//! two, or within one's headers. HTTP/1.1 only: our clients' WebSockets are HTTP/1.1
//! upgrades and the API is a few small JSON calls, so HTTP/2 would add a second protocol
//! (its own idle, ping and stream-reset rules to bound) for nothing.
//!
//! A request's header block is capped at [`MAX_HEADER_BYTES`] (hyper answers 431 past
//! it; its default let each connection buffer about 400 KB), and its body must arrive
//! whole within the body deadline (408 otherwise): a body trickled in a byte at a time
//! would hold its connection and its task for as long as the sender liked.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::body::HttpBody as _;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use axum_server::accept::Accept;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tower::ServiceBuilder;

/// How long connections still busy with a request get once the server stops.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// Pause after a failed accept (e.g. no file descriptor left): the loop must not spin, and
/// descriptors come back as deadlines close silent connections.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Most bytes of a request's line and headers: far above what our clients send (a token
/// and a few short headers), far below hyper's default of about 400 KB per connection.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// How long a request may take to arrive.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// For the headers (and for silence before and between requests).
    pub header: Duration,
    /// For the whole body, counted from the end of the headers.
    pub body: Duration,
}

/// Serves `app` on `listener` until `stop` completes: each accepted connection goes through
/// `acceptor` (limits, TLS), then HTTP/1.1 within `deadlines`. Once stopped, no new
/// connection is taken; those within a request get [`STOP_GRACE`] to finish.
pub async fn serve<A>(
    listener: TcpListener,
    acceptor: A,
    app: Router,
    deadlines: Deadlines,
    stop: impl Future<Output = ()>,
) where
    A: Accept<TcpStream, ()> + Clone + Send + Sync + 'static,
    A::Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    A::Future: Send,
{
    let (stopping_tx, stopping) = watch::channel(false);
    // Every connection task holds a sender; all dropped: every connection is done.
    let (done_tx, mut all_done) = mpsc::channel::<()>(1);
    let body_deadline = deadlines.body;
    let app = app.layer(axum::middleware::from_fn(
        move |request: Request<Body>, next: Next| whole_body_within(body_deadline, request, next),
    ));
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            biased;
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let connection = serve_connection(
            tcp,
            peer,
            acceptor.clone(),
            app.clone(),
            deadlines.header,
            stopping.clone(),
        );
        let done = done_tx.clone();
        tokio::spawn(async move {
            connection.await;
            drop(done);
        });
    }
    // Refuse new connections at once rather than leave them in the kernel's queue.
    drop(listener);
    let _ = stopping_tx.send(true);
    drop(done_tx);
    let _ = tokio::time::timeout(STOP_GRACE, all_done.recv()).await;
}

async fn serve_connection<A>(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: A,
    app: Router,
    header_timeout: Duration,
    mut stopping: watch::Receiver<bool>,
) where
    A: Accept<TcpStream, ()>,
    A::Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Refused (over a limit) or a failed TLS handshake: dropping the stream closes it.
    let Ok((stream, _)) = acceptor.accept(tcp, ()).await else {
        return;
    };
    // Handlers that need the peer's address (connection limits) read it as axum's
    // `ConnectInfo`.
    let service = ServiceBuilder::new()
        .map_request(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            request
        })
        .service(app);
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(MAX_HEADER_BYTES)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
        .with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        result = &mut connection => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        // The only change ever sent is the stop (a dropped sender means the same).
        _ = stopping.changed() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// Reads a request's body whole within `deadline` before the handler sees it: 408 (and
/// the connection closed) when it is late, 413 past [`crate::api::MAX_BODY_BYTES`], the
/// limit every route has anyway. Requests without a body (WebSocket upgrades, GETs) pass
/// straight through.
async fn whole_body_within(deadline: Duration, request: Request<Body>, next: Next) -> Response {
    if request.body().size_hint().exact() == Some(0) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, crate::api::MAX_BODY_BYTES);
    match tokio::time::timeout(deadline, read).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                crate::api::ApiError::PayloadTooLarge(format!(
                    "request body larger than {} bytes",
                    crate::api::MAX_BODY_BYTES
                ))
                .into_response()
            } else {
                // The client broke off its body: nobody is left to read an answer.
                crate::api::ApiError::BadRequest(format!("cannot read the request body: {e}"))
                    .into_response()
            }
        }
        Err(_) => {
            let mut response = crate::http_error::response(
                StatusCode::REQUEST_TIMEOUT,
                "REQUEST_TIMEOUT",
                &format!("the request body did not arrive within {deadline:?}"),
            );
            // The rest of the body is never read: the connection cannot carry another
            // request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}
