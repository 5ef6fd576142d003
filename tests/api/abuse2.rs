//! Abuse and trust, round 2 (issue 29): what a hostile user tried against the landed tree.
//! Each test failed on the code before its fix.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::helpers::*;

/// What a client that opens a connection and never finishes a request can hold.
enum Silent {
    /// Sends nothing at all.
    Tcp(TcpStream),
    /// Completed a TLS handshake, then nothing.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Silent {
    /// Waits until the server ends the connection; returns how long that took.
    async fn closed_within(self, limit: Duration) -> Duration {
        let started = Instant::now();
        let mut buffer = Vec::new();
        let read = async {
            match self {
                // An error (a reset) ends it as well as an end of stream does.
                Silent::Tcp(mut tcp) => tcp.read_to_end(&mut buffer).await.map(|_| ()),
                Silent::Tls(mut tls) => tls.read_to_end(&mut buffer).await.map(|_| ()),
            }
        };
        let _ = tokio::time::timeout(limit, read)
            .await
            .expect("the server ends a silent connection in time");
        started.elapsed()
    }
}

/// Item 2: a connection that sends nothing, only the HTTP/2 preface, or one request and
/// then nothing is closed within the header deadline; /healthz answers all along.
#[tokio::test]
async fn silent_connections_are_closed_on_a_deadline() {
    let server = TestServer::start_with(|c| c.header_read_timeout_secs = 1).await;
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(Silent::Tcp(TcpStream::connect(server.addr).await.unwrap()));
    }
    for _ in 0..20 {
        let mut tcp = TcpStream::connect(server.addr).await.unwrap();
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        silent.push(Silent::Tcp(tcp));
    }
    // One keep-alive request answered, then silence.
    let mut kept = TcpStream::connect(server.addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    kept.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    silent.push(Silent::Tcp(kept));

    let health = server
        .http
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    for connection in silent {
        let took = connection.closed_within(WAIT).await;
        assert!(took < WAIT, "closed after {took:?}");
    }
}

/// A self-signed certificate for 127.0.0.1, written where the server reads it.
fn tls_files(dir: &std::path::Path) -> (String, String, Vec<u8>) {
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    let cert = params.self_signed(&key).expect("certificate");
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (
        cert_path.to_string_lossy().into_owned(),
        key_path.to_string_lossy().into_owned(),
        cert.der().to_vec(),
    )
}

/// Item 2, over TLS: a client that completes the handshake and goes silent, and one that
/// never finishes the handshake, are both closed within the deadline.
#[tokio::test]
async fn silent_tls_connections_are_closed_on_a_deadline() {
    let dir = std::env::temp_dir().join(format!("tls-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, der) = tls_files(&dir);
    let server = TestServer::start_with(|c| {
        c.header_read_timeout_secs = 1;
        c.tls_cert = Some(cert.into());
        c.tls_key = Some(key.into());
    })
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.into()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let mut silent = Vec::new();
    for _ in 0..10 {
        let tcp = TcpStream::connect(server.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let tls = connector.connect(name, tcp).await.expect("TLS handshake");
        silent.push(Silent::Tls(Box::new(tls)));
    }
    for _ in 0..10 {
        let mut tcp = TcpStream::connect(server.addr).await.unwrap();
        // The start of a ClientHello record, never finished.
        tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
            .await
            .unwrap();
        silent.push(Silent::Tcp(tcp));
    }
    for connection in silent {
        let took = connection.closed_within(WAIT).await;
        assert!(took < WAIT, "closed after {took:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plain GET from `from` (an address of the loopback range): the status line's code, or
/// 0 when no answer comes within `limit`.
async fn health_from(from: [u8; 4], server: SocketAddr, limit: Duration) -> u16 {
    let attempt = async {
        let socket = TcpSocket::new_v4().ok()?;
        socket.bind(SocketAddr::from((from, 0))).ok()?;
        let mut tcp = socket.connect(server).await.ok()?;
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await.ok()?;
        let line = String::from_utf8_lossy(&answer);
        line.split(' ').nth(1)?.parse().ok()
    };
    tokio::time::timeout(limit, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// Item 2: with 256 open files allowed, 306 silent connections from one address do not
/// take the server's descriptors: it refuses that address's connections past its cap and
/// answers /healthz for another address at once, without waiting for any deadline.
#[tokio::test]
async fn silent_connections_from_one_address_cannot_take_every_descriptor() {
    let (database_url, _) = test_database().await;
    let server =
        ServerProcess::start_limited(&database_url, &["--max-tcp-connections-per-ip", "100"], 256);
    let addr: SocketAddr = server.addr.parse().unwrap();
    let mut silent = Vec::new();
    for _ in 0..306 {
        if let Ok(tcp) = TcpStream::connect(addr).await {
            silent.push(tcp);
        }
    }
    assert_eq!(
        health_from([127, 0, 0, 2], addr, Duration::from_secs(5)).await,
        200,
        "health from another address while 306 silent connections were opened"
    );
    drop(silent);
    let log = server.stop();
    assert!(!log.contains("panicked"), "{log}");
}

/// Item 3: five sockets of one viewer's token, each within its own rate and strike
/// limits, flood a robot that does not read. Together they get the share of one sender
/// (their subject's), all viewers together at most half the robot's queue: they are told
/// `relay_throttled`, the robot is never closed for it, and the operator still gets
/// through.
#[tokio::test]
async fn one_viewers_sockets_together_cannot_get_a_robot_dropped() {
    let server = TestServer::start_with(|c| {
        c.rate_limit = 1_000_000;
        c.rate_burst = 1_000_000;
        c.max_strikes = 1_000_000;
        c.send_queue = 64;
        // The robot's kernel buffers fill in a moment, not after several seconds.
        c.relay_bytes_per_sec = 0;
        // Item 4's cap is not under test here.
        c.max_viewer_sessions_per_subject = 16;
    })
    .await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut alice = server.client_for("robot-1", "alice", "operator").await;
    let alice_session = alice.connection_id.clone();
    alice.send(&offer("robot-1", &alice_session)).await;
    robot.recv_type("signalling.offer").await;
    server.grant("robot-1", "mallory", "viewer").await;
    let token = server.client_token("mallory").await;
    let mut mallory = Vec::new();
    for _ in 0..5 {
        let mut socket = WsClient::connect_with_token(&server.ws_url(), &token).await;
        let session = socket.connection_id.clone();
        socket.send(&offer("robot-1", &session)).await;
        robot.recv_type("signalling.offer").await;
        mallory.push((socket, session));
    }

    // The robot stops reading; each socket sends ~6 MB, more than the kernel buffers and
    // the whole queue (64 frames) hold.
    for round in 0..100 {
        for (socket, session) in &mut mallory {
            let flood = big_candidate(session, 60_000);
            if !socket.try_send_text(flood.to_string()).await {
                panic!("mallory's socket closed in round {round}");
            }
        }
    }
    let mut throttled = 0;
    for (socket, _) in &mut mallory {
        throttled += throttled_until_pong(socket).await;
    }
    assert!(
        throttled > 300,
        "the flooders were throttled {throttled} times"
    );
    assert!(
        server.state.presence.is_online("robot-1"),
        "the robot was dropped"
    );

    // The operator's candidate still gets into the queue and reaches the robot.
    let candidate = ice(&alice_session);
    alice.send(&candidate).await;
    alice.expect_nothing_pending().await;
    loop {
        let message = robot.recv().await;
        assert_eq!(message["type"], "signalling.ice_candidate", "{message}");
        if message["id"] == candidate["id"] {
            break;
        }
    }
    robot.expect_nothing_pending().await;
    assert!(server.state.presence.is_online("robot-1"));
}

/// Item 4: one viewer cannot take every place a robot has. Viewing sessions are capped per
/// subject (4 by default) and per robot (12): a viewer's fifth offer is refused, whatever
/// socket it comes from, and the operator's offer still reaches the robot.
#[tokio::test]
async fn one_viewer_cannot_lock_the_operator_out() {
    let server = TestServer::start().await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let mut mallory = server.client_for("robot-1", "mallory", "viewer").await;
    for i in 0..4 {
        mallory.send(&offer("robot-1", &format!("m-{i}"))).await;
        robot.recv_type("signalling.offer").await;
    }
    for i in 4..16 {
        let attempt = offer("robot-1", &format!("m-{i}"));
        mallory.send(&attempt).await;
        let error = mallory.expect_error("FORBIDDEN").await;
        assert_eq!(error["correlationId"], attempt["id"]);
        assert_eq!(error["payload"]["details"]["reason"], "too_many_viewers");
        assert_eq!(error["payload"]["details"]["per"], "per_subject");
    }
    // Another socket of the same token is the same subject.
    let token = server.client_token("mallory").await;
    let mut again = WsClient::connect_with_token(&server.ws_url(), &token).await;
    let session = again.connection_id.clone();
    again.send(&offer("robot-1", &session)).await;
    again.expect_error("FORBIDDEN").await;

    let mut alice = server.client_for("robot-1", "alice", "operator").await;
    let session = alice.connection_id.clone();
    alice.send(&offer("robot-1", &session)).await;
    let offered = robot.recv_type("signalling.offer").await;
    assert_eq!(offered["payload"]["connectionId"], session.as_str());
    robot.expect_nothing_pending().await;
}

/// Item 3, the other way: a viewer that stops reading while the robot keeps sending to it
/// (answers to its renegotiations, candidates) gets the robot told `relay_throttled`, but
/// the robot earns no strikes for it and is never cut off.
#[tokio::test]
async fn a_stalled_viewer_cannot_get_the_robot_cut_off_for_strikes() {
    let server = TestServer::start_with(|c| {
        c.relay_bytes_per_sec = 0;
        c.max_strikes = 5;
        // Only the relay's fairness is under test, not the per-socket message limit.
        c.rate_limit = 1_000_000;
        c.rate_burst = 1_000_000;
    })
    .await;
    let (mut robot, _) = server.online_robot("robot-1").await;
    let (_carol, session) = server
        .open_session(&mut robot, "robot-1", "carol", "viewer")
        .await;
    // carol never reads again; the robot sends far more than her queue and the kernel's
    // buffers hold.
    for _ in 0..300 {
        robot.send(&big_candidate(&session, 60_000)).await;
    }
    let throttled = throttled_until_pong(&mut robot).await;
    assert!(throttled > 5, "throttled {throttled} times");
    assert!(
        server.state.presence.is_online("robot-1"),
        "the robot was cut off"
    );
    robot.expect_nothing_pending().await;
}
