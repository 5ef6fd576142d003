//! The local listener's gate over real sockets (issue 41): browser
//! origins, tokens, handshake deadline and connection caps.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use super::*;
use crate::arp::config::ListenConfig;
use crate::arp::ArpOptions;
use crate::testutil::arp::{fixture, Client, Fixture, OPERATOR};
use crate::testutil::WAIT;

type Ws = crate::testutil::WsClient;

/// A second listener on 127.0.0.1:0 for the fixture's ARP server.
async fn listen(
    f: &Fixture,
    tokens: &[&str],
    configure: impl FnOnce(ArpListener) -> ArpListener,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let tokens = tokens.iter().map(|t| t.parse().expect("token")).collect();
    let listener = ArpListener::bind(&ListenConfig::new("127.0.0.1:0", tokens).expect("listen"))
        .await
        .expect("bind");
    let listener = configure(listener);
    let addr = listener.local_addr().expect("addr");
    (addr, tokio::spawn(listener.run(f.server.clone())))
}

/// Opens a WebSocket with these extra headers; `Err(status)` when the
/// upgrade is refused.
async fn open(addr: SocketAddr, headers: &[(&str, &str)]) -> Result<Ws, u16> {
    crate::testutil::ws_upgrade(&addr.to_string(), headers).await
}

async fn rpc(ws: &mut Ws, id: &str, method: &str, params: Value) -> Value {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::text(request.to_string()))
        .await
        .expect("send");
    loop {
        let message = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
            .expect("open")
            .expect("frame");
        let Message::Text(text) = message else {
            continue;
        };
        let value: Value = serde_json::from_str(&text).expect("JSON");
        if value["id"] == id && value.get("method").is_none() {
            return value;
        }
    }
}

/// What a page that got the socket could do: the drive's final state.
async fn drive(ws: &mut Ws) -> Value {
    rpc(
        ws,
        "i",
        "arp.initialize",
        json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "page", "version": "1"}}),
    )
    .await;
    let done = rpc(
        ws,
        "d",
        "arp.callTool",
        json!({"name": "drive", "arguments": {"linear": 0.1, "angular": 0.0, "durationSecs": 0.2}}),
    )
    .await;
    done["result"]["state"].clone()
}

const EVIL: &str = "https://evil.example";
/// The handshake deadline the silent-connection test gives its listener.
const DEADLINE: Duration = Duration::from_millis(1500);

/// Issue 41 #2: a web page opening `ws://127.0.0.1:P` gets 403, with or
/// without a token, on a token-less (`--arp-no-token`) socket too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_pages_websocket_is_refused_with_403() {
    let f = fixture(ArpOptions::default()).await;
    let (open_addr, _open_task) = listen(&f, &[], |l| l).await;
    match open(open_addr, &[("origin", EVIL)]).await {
        Err(status) => assert_eq!(status, 403, "a page's origin on the token-less socket"),
        Ok(mut ws) => panic!(
            "a WebSocket with Origin: {EVIL} upgraded as operator on the token-less socket; its drive ended {}",
            drive(&mut ws).await
        ),
    }
    let (addr, _task) = listen(&f, &[OPERATOR], |l| l).await;
    let bearer = format!(
        "Bearer {}",
        OPERATOR.split_once(':').expect("ROLE:SECRET").1
    );
    for origin in [EVIL, "null", "http://127.0.0.1:8080"] {
        match open(addr, &[("origin", origin), ("authorization", &bearer)]).await {
            Err(status) => assert_eq!(status, 403, "{origin} with a valid token"),
            Ok(_) => panic!("Origin: {origin} with a token upgraded"),
        }
    }
    assert_eq!(
        open(addr, &[("origin", EVIL)]).await.err(),
        Some(403),
        "origin checked first"
    );
    assert_eq!(
        open(addr, &[]).await.err(),
        Some(401),
        "a program without a token"
    );
    let mut program = open(addr, &[("authorization", &bearer)])
        .await
        .expect("a program with its token");
    assert_eq!(drive(&mut program).await, "completed");
    assert_eq!(f.probe.state().linear, 0.0, "nothing moving");

    // A listed origin (compared without case or a trailing slash) gets in.
    let console = vec!["https://Console.Example/".to_owned()];
    let (listed, _listed_task) = listen(&f, &[OPERATOR], |l| l.allow_origins(&console)).await;
    assert!(open(
        listed,
        &[
            ("origin", "https://console.example"),
            ("authorization", &bearer)
        ]
    )
    .await
    .is_ok());
    assert_eq!(
        open(listed, &[("origin", EVIL), ("authorization", &bearer)])
            .await
            .err(),
        Some(403)
    );
    assert_eq!(
        open(listed, &[("origin", "https://console.example")])
            .await
            .err(),
        Some(401)
    );
}

/// Issue 41 #5: more silent TCP connections than there are slots, from
/// several addresses, do not keep an authenticated program out, and every
/// one of them (and one that sends half a request) is closed by the
/// handshake deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_neither_lock_the_port_nor_outlive_the_deadline() {
    let f = fixture(ArpOptions::default()).await;
    let (addr, _task) = listen(&f, &[OPERATOR], |l| l.handshake_timeout(DEADLINE)).await;
    let started = Instant::now();
    let mut silent = Vec::new();
    // 70 > MAX_CONNECTIONS, 14 per address (under MAX_PER_ADDRESS).
    for i in 0..70u8 {
        silent.push(connect_from([127, 0, 0, 2 + i % 5], addr).await);
    }
    let mut half = connect_from([127, 0, 0, 7], addr).await;
    half.write_all(b"GET / HTTP/1.1\r\nHost: robot\r\nUpgrade: websocket\r\n")
        .await
        .expect("half a request");
    silent.push(half);
    // Queued behind the silent ones on the same listener.
    let mut program = Client::connect(&format!("ws://{addr}/"), OPERATOR).await;
    program.initialize().await;

    let closed = futures_util::future::join_all(silent.into_iter().map(|mut tcp| async move {
        let mut byte = [0u8; 1];
        let read =
            tokio::time::timeout(DEADLINE + Duration::from_secs(3), tcp.read(&mut byte)).await;
        (read.map(|r| matches!(r, Ok(0) | Err(_))), started.elapsed())
    }))
    .await;
    for (i, (read, when)) in closed.iter().enumerate() {
        assert!(
            matches!(read, Ok(true)),
            "silent connection {i} still open (or got data) {when:?} after it was made; deadline {DEADLINE:?}"
        );
        assert!(*when < DEADLINE + Duration::from_secs(3));
    }
    // The program is still served.
    program.result("arp.listTools", json!({})).await;
}

/// Issue 41 #5: one address holds at most MAX_PER_ADDRESS connections;
/// the rest are closed at once, and other addresses still get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_connections() {
    let f = fixture(ArpOptions::default()).await;
    let (addr, _task) = listen(&f, &[OPERATOR], |l| l).await;
    let mut silent = Vec::new();
    for _ in 0..MAX_PER_ADDRESS + 4 {
        silent.push(connect_from([127, 0, 0, 8], addr).await);
    }
    // Served after the 20 were: their fate is decided when it is in.
    let mut program = Client::connect(&format!("ws://{addr}/"), OPERATOR).await;
    program.initialize().await;
    let mut refused = 0;
    for tcp in silent {
        let tcp = tcp.into_std().expect("std socket");
        let mut byte = [0u8; 1];
        match std::io::Read::read(&mut &tcp, &mut byte) {
            Ok(0) => refused += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        refused, 4,
        "connections beyond {MAX_PER_ADDRESS} from one address closed at once"
    );
}

/// A TCP connection from a given loopback source address.
async fn connect_from(source: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind a loopback source");
    socket.connect(addr).await.expect("connect")
}
