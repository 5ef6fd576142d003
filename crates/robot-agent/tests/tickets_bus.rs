//! Session tickets against an attacker on the cluster bus (issue 33): the real server as a
//! node of a cluster (PostgreSQL, Redis), the real robot-agent enrolled with it (the
//! server's key pinned), and a raw Redis PUBLISH that plays a node: it opens a session on
//! the robot's node and hands the robot an offer with a made-up `meta.session`. The robot
//! refuses it (`bad_ticket`, published back to the made-up node); the same injection with a
//! ticket signed by the deployment's key is answered.
//!
//! Like the server's cluster suite, ignored by default:
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test SIGNALLING_CLUSTER_TEST=1
//! REDIS_URL=redis://127.0.0.1:6379 cargo test -p robot-agent --test tickets_bus -- --ignored`

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use robot_agent::config::{RunConfig, RunFlags};
use robot_agent::enroll::{enroll, EnrollRequest};
use robot_agent::identity::KeyType;
use serde_json::{json, Value};
use signalling_protocol::ticket::TicketClaims;
use signalling_protocol::Role;
use signalling_server::{Config, Server};

const ADMIN: &str = "tickets-bus-admin-token";
const ROBOT: &str = "robot-bus-1";
const EVIL: &str = "evil-node";
const WAIT: Duration = Duration::from_secs(20);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A schema of its own in the PostgreSQL of DATABASE_URL.
async fn database(url: &str) -> String {
    let schema = format!("tickets_bus_{}", uuid::Uuid::new_v4().simple());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("PostgreSQL from DATABASE_URL");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&pool)
        .await
        .expect("create schema");
    pool.close().await;
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

async fn admin(
    http: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Value {
    let mut request = http
        .request(method, format!("{base}{path}"))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("HTTP");
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.json().await.unwrap_or(Value::Null)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A browser-like offer with a `control` data channel.
async fn offer_sdp() -> (
    std::sync::Arc<webrtc::peer_connection::RTCPeerConnection>,
    String,
) {
    use webrtc::api::media_engine::MediaEngine;
    use webrtc::api::setting_engine::SettingEngine;
    use webrtc::api::APIBuilder;
    use webrtc::ice::mdns::MulticastDnsMode;
    use webrtc::peer_connection::configuration::RTCConfiguration;
    let mut settings = SettingEngine::default();
    settings.set_ice_multicast_dns_mode(MulticastDnsMode::Disabled);
    settings.set_include_loopback_candidate(true);
    settings.set_ip_filter(Box::new(|ip: std::net::IpAddr| ip.is_loopback()));
    let mut media = MediaEngine::default();
    media.register_default_codecs().expect("codecs");
    let api = APIBuilder::new()
        .with_media_engine(media)
        .with_setting_engine(settings)
        .build();
    let pc = std::sync::Arc::new(
        api.new_peer_connection(RTCConfiguration::default())
            .await
            .expect("pc"),
    );
    pc.create_data_channel("control", None)
        .await
        .expect("channel");
    let offer = pc.create_offer(None).await.expect("offer");
    pc.set_local_description(offer).await.expect("local");
    let sdp = pc.local_description().await.expect("sdp").sdp;
    (pc, sdp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and Redis: SIGNALLING_CLUSTER_TEST=1 DATABASE_URL=postgres://… REDIS_URL=redis://…"]
async fn an_offer_published_on_the_bus_without_a_good_ticket_is_refused_by_the_robot() {
    let (Some(_), Some(pg), Some(redis_url)) = (
        env("SIGNALLING_CLUSTER_TEST"),
        env("DATABASE_URL").filter(|u| u.starts_with("postgres")),
        env("REDIS_URL"),
    ) else {
        eprintln!(
            "skipped: set SIGNALLING_CLUSTER_TEST=1, a postgres:// DATABASE_URL and REDIS_URL"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("tickets-bus-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    // The deployment's key in a file, so that this test can sign as the server does.
    let rng = ring::rand::SystemRandom::new();
    let der = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
    let key_file = dir.join("signing-key.pem");
    std::fs::write(
        &key_file,
        pem::encode(&pem::Pem::new("PRIVATE KEY", der.as_ref().to_vec())),
    )
    .expect("write");
    let prefix = format!("tickets-bus-{}:", uuid::Uuid::new_v4().simple());
    let node = format!("node-{}", uuid::Uuid::new_v4().simple());

    let mut config = Config::from_args([
        "signalling-server",
        "--listen",
        "127.0.0.1:0",
        "--admin-token",
        ADMIN,
    ])
    .expect("config");
    config.database_url = Some(database(&pg).await);
    config.redis_url = Some(redis_url.clone());
    config.redis_prefix = prefix.clone();
    config.node_id = Some(node.clone());
    config.signing_key_file = Some(key_file);
    let server = Server::bind(config).await.expect("server starts");
    let base = format!("http://{}", server.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = server
            .run(async move {
                let _ = stopped.await;
            })
            .await;
    });
    let http = reqwest::Client::new();

    let created = admin(
        &http,
        &base,
        reqwest::Method::POST,
        "/v1/robots",
        Some(json!({"robotId": ROBOT})),
    )
    .await;
    let agent_dir = dir.join("agent");
    let enrolled = enroll(&EnrollRequest {
        server: base.clone(),
        robot_id: ROBOT.into(),
        token: created["enrollmentToken"].as_str().expect("token").into(),
        key_type: KeyType::Ed25519,
        csr: false,
        config_dir: agent_dir.clone(),
        ca_file: None,
    })
    .await
    .expect("the agent enrolls");
    assert_eq!(enrolled.server_keys.len(), 1, "the server's key is pinned");
    let agent_config = RunConfig::resolve(RunFlags {
        config_dir: Some(agent_dir),
        server: Some(base.replace("http://", "ws://") + "/ws"),
        robot_id: Some(ROBOT.into()),
        driver: Some("sim".into()),
        ..RunFlags::default()
    })
    .expect("agent config");
    let agent = tokio::spawn(robot_agent::agent::run(agent_config));

    // The robot's socket, as every node finds it: `robot:{id}` = node, connection.
    let client = redis::Client::open(redis_url.as_str()).expect("redis");
    let mut redis_conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let deadline = tokio::time::Instant::now() + WAIT;
    let robot_conn = loop {
        let presence: Option<String> = redis::cmd("GET")
            .arg(format!("{prefix}robot:{ROBOT}"))
            .query_async(&mut redis_conn)
            .await
            .expect("GET");
        if let Some((at, conn)) = presence.as_deref().and_then(|p| p.split_once('\n')) {
            assert_eq!(at, node);
            break conn.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never came online"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // Listen as the made-up node: the robot's replies to "its" client come here.
    let mut pubsub = client.get_async_pubsub().await.expect("pubsub");
    pubsub
        .subscribe(format!("{prefix}node:{EVIL}"))
        .await
        .expect("subscribe");
    let mut replies = pubsub.into_on_message();

    let (pc, sdp) = offer_sdp().await;
    let encoding = EncodingKey::from_ed_der(der.as_ref());
    let kid = enrolled.server_keys[0].clone();
    let sign = |claims: &TicketClaims| {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.clone());
        jsonwebtoken::encode(&header, claims, &encoding).expect("sign")
    };
    let claims = |session: &str| TicketClaims {
        robot: ROBOT.into(),
        connection_id: session.into(),
        subject: "mallory".into(),
        role: Role::Owner,
        node: EVIL.into(),
        iat: now(),
        exp: now() + 60,
        jti: Some(uuid::Uuid::new_v4().to_string()),
        call_id: None,
        params_hash: None,
        kx: None,
    };
    let forged_elsewhere = sign(&claims("another-session"));
    let cases: Vec<(String, Value, bool)> = vec![
        (
            "bus-1".into(),
            json!({"subject": "mallory", "role": "owner"}),
            false,
        ),
        (
            "bus-2".into(),
            json!({"subject": "mallory", "role": "owner", "ticket": "eyJhbGciOiJub25lIn0.e30."}),
            false,
        ),
        (
            "bus-3".into(),
            json!({"subject": "mallory", "role": "owner", "ticket": forged_elsewhere}),
            false,
        ),
        (
            "bus-ok".into(),
            json!({"subject": "mallory", "role": "owner", "ticket": sign(&claims("bus-ok"))}),
            true,
        ),
    ];
    for (session, meta, good) in cases {
        let client_conn = format!("evil-conn-{session}");
        let open = json!({
            "origin": EVIL, "kind": "open",
            "session_id": session, "record_id": uuid::Uuid::new_v4().to_string(),
            "robot_id": ROBOT, "robot_conn": robot_conn, "client_conn": client_conn,
            "client_node": EVIL, "subject": "mallory", "role": "owner",
        });
        let offer = json!({
            "type": "signalling.offer", "version": "0.5", "id": uuid::Uuid::new_v4().to_string(),
            "timestamp": "2026-01-06T12:00:00Z",
            "payload": {"robotId": ROBOT, "connectionId": session, "sdp": sdp, "sdpType": "offer"},
            "meta": {"session": meta},
        });
        let channel = format!("{prefix}node:{node}");
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(format!("J{open}"))
            .query_async(&mut redis_conn)
            .await
            .expect("PUBLISH open");
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(format!("F{client_conn}\n{robot_conn}\n{session}\n{offer}"))
            .query_async(&mut redis_conn)
            .await
            .expect("PUBLISH offer");
        // The robot's reply for this session, relayed back to the made-up node.
        let reply = tokio::time::timeout(WAIT, async {
            loop {
                let message = replies.next().await.expect("subscription open");
                let payload: Vec<u8> = message.get_payload().expect("bytes");
                let text = String::from_utf8_lossy(&payload).into_owned();
                if text.contains(&format!("\"connectionId\":\"{session}\"")) {
                    break text;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no reply from the robot for {session}"));
        if good {
            assert!(reply.contains("signalling.answer"), "{session}: {reply}");
        } else {
            assert!(
                reply.contains("signalling.disconnected") && reply.contains("bad_ticket"),
                "{session}: {reply}"
            );
        }
    }
    pc.close().await.expect("close");
    agent.abort();
    let _ = stop.send(());
    let _ = std::fs::remove_dir_all(dir);
}
