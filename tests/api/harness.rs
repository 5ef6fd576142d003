//! The harness's own checks: `expect_close` and `recv` fail on what they must refuse, so a
//! server that resets, hangs or breaks the spec cannot pass a test by accident. The "server"
//! here is a bare WebSocket endpoint on port 0 that misbehaves on purpose.

use std::future::Future;
use std::time::Duration;

use futures_util::SinkExt;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::helpers::*;

/// A client connected to an endpoint that runs `behave` on its side of the socket.
async fn client_of<F, Fut>(behave: F) -> WsClient
where
    F: FnOnce(WebSocketStream<TcpStream>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        behave(tokio_tungstenite::accept_async(tcp).await.unwrap()).await;
    });
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect in time")
        .expect("upgrade");
    WsClient::over(ws)
}

#[tokio::test]
async fn expect_close_returns_the_code_and_reason() {
    let mut client = client_of(|mut ws| async move {
        let frame = CloseFrame {
            code: CloseCode::Policy,
            reason: "because".into(),
        };
        ws.send(Message::Close(Some(frame))).await.unwrap();
        // Wait for the client's reply so the close handshake completes.
        let _ = futures_util::StreamExt::next(&mut ws).await;
    })
    .await;
    assert_eq!(client.expect_close_with(1008).await, "because");
}

#[tokio::test]
#[should_panic(expected = "expected a close frame, got Ended(")]
async fn expect_close_fails_on_an_end_without_a_close_frame() {
    let mut client = client_of(|ws| async move { drop(ws) }).await;
    client.expect_close().await;
}

#[tokio::test]
#[should_panic(expected = "expected a close frame, got Ended(")]
async fn expect_close_fails_on_a_reset() {
    let mut client = client_of(|ws| async move {
        // Zero linger turns the drop into a TCP reset.
        ws.get_ref().set_zero_linger().unwrap();
        drop(ws);
    })
    .await;
    client.expect_close().await;
}

#[tokio::test]
#[should_panic(expected = "expected a close frame, got Other(Binary")]
async fn expect_close_fails_on_a_data_frame() {
    let mut client = client_of(|mut ws| async move {
        ws.send(Message::Binary(vec![1].into())).await.unwrap();
        ws.close(None).await.ok();
    })
    .await;
    client.expect_close().await;
}

#[tokio::test]
#[should_panic(expected = "expected a close frame, got Text(")]
async fn expect_close_fails_on_a_message() {
    let mut client = client_of(|mut ws| async move {
        let mut pong = envelope("signalling.pong", None);
        pong["correlationId"] = json!("a-ping");
        ws.send(Message::Text(pong.to_string().into()))
            .await
            .unwrap();
        ws.close(None).await.ok();
    })
    .await;
    client.expect_close().await;
}

#[tokio::test]
#[should_panic(expected = "timed out after 50ms waiting for a close frame")]
async fn expect_close_fails_when_nothing_comes() {
    let (hold, held) = tokio::sync::oneshot::channel::<()>();
    let mut client = client_of(|ws| async move {
        let _ = held.await;
        drop(ws);
    })
    .await;
    client.wait = Duration::from_millis(50);
    client.expect_close().await;
    drop(hold);
}

#[tokio::test]
#[should_panic(expected = "breaks the spec")]
async fn recv_fails_on_a_message_that_breaks_the_spec() {
    let mut client = client_of(|mut ws| async move {
        let bad = json!({"type": "signalling.pong", "version": "0.3"});
        ws.send(Message::Text(bad.to_string().into()))
            .await
            .unwrap();
        ws.close(None).await.ok();
    })
    .await;
    client.recv().await;
}
