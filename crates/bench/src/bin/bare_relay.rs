//! The limit: a bare tokio-tungstenite relay that routes `{"to": id}` messages by id with no
//! checks at all. Connect as `ws://HOST:PORT/?id=ID`; it acks with `{"welcome": ID}`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

type Peers = Arc<Mutex<HashMap<String, mpsc::Sender<Message>>>>;

#[derive(Deserialize)]
struct Addressed<'a> {
    #[serde(borrow)]
    to: &'a str,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9001".into());
    let listener = TcpListener::bind(&addr).await?;
    println!("listening {}", listener.local_addr()?);
    let peers: Peers = Arc::default();
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(serve(stream, peers.clone()));
    }
}

// tungstenite's handshake callback signature returns its large error response type.
#[allow(clippy::result_large_err)]
async fn serve(stream: TcpStream, peers: Peers) {
    let _ = stream.set_nodelay(true);
    let mut id = String::new();
    let callback = |request: &Request, response: Response| {
        id = request
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("id=")))
            .unwrap_or_default()
            .to_string();
        Ok(response)
    };
    let Ok(socket) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
        return;
    };
    let (mut sink, mut source) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Message>(1024);
    if let Ok(mut map) = peers.lock() {
        map.insert(id.clone(), tx);
    }
    let welcome = format!("{{\"welcome\":\"{id}\"}}");
    if sink.send(Message::Text(welcome.into())).await.is_err() {
        return;
    }
    let writer = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
    });
    while let Some(Ok(message)) = source.next().await {
        let Message::Text(text) = &message else {
            continue;
        };
        let Ok(addressed) = serde_json::from_str::<Addressed>(text) else {
            continue;
        };
        let target = peers
            .lock()
            .ok()
            .and_then(|map| map.get(addressed.to).cloned());
        if let Some(target) = target {
            let _ = target.try_send(message.clone());
        }
    }
    if let Ok(mut map) = peers.lock() {
        map.remove(&id);
    }
    writer.abort();
}
