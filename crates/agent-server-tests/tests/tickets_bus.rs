//! Session tickets against an attacker on the cluster bus (issue 33): the real server as a
//! node of a cluster (PostgreSQL, Redis), the real robot-agent enrolled with it (the
//! server's key pinned), and a raw Redis PUBLISH that plays a node: it opens a session on
//! the robot's node and hands the robot an offer with a made-up `meta.session`. The robot
//! refuses it (`bad_ticket`, published back to the made-up node); the same injection with a
//! ticket signed by the deployment's key is answered.
//!
//! Like the server's cluster suite, ignored by default:
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test SIGNALLING_CLUSTER_TEST=1
//! REDIS_URL=redis://127.0.0.1:6379 cargo test --workspace --test tickets_bus -- --ignored`

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_server_tests::server;
use futures_util::StreamExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use robot_agent::testutil::browser::offer_sdp;
use serde_json::{json, Value};
use signalling_protocol::ticket::TicketClaims;
use signalling_protocol::Role;

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

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// The robot's socket, as every node finds it: `robot:{id}` = node, connection.
async fn robot_connection(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    node: &str,
) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let presence: Option<String> = redis::cmd("GET")
            .arg(format!("{prefix}robot:{ROBOT}"))
            .query_async(conn)
            .await
            .expect("GET");
        if let Some((at, robot_conn)) = presence.as_deref().and_then(|p| p.split_once('\n')) {
            assert_eq!(at, node);
            return robot_conn.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never came online"
        );
        // Polling Redis: presence is a key, with no event to wait on.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The cluster bus, written to as a made-up node would.
struct Bus<'a> {
    conn: &'a mut redis::aio::MultiplexedConnection,
    prefix: &'a str,
    node: &'a str,
    robot_conn: &'a str,
}

impl Bus<'_> {
    /// Opens `session` on the robot's node for the made-up node's client and
    /// hands the robot an offer with `meta` as its `meta.session`.
    async fn offer(self, session: &str, meta: Value, sdp: &str) {
        let client_conn = format!("evil-conn-{session}");
        let open = json!({
            "origin": EVIL, "kind": "open",
            "session_id": session, "record_id": uuid::Uuid::new_v4().to_string(),
            "robot_id": ROBOT, "robot_conn": self.robot_conn, "client_conn": client_conn,
            "client_node": EVIL, "subject": "mallory", "role": "owner",
        });
        let offer = json!({
            "type": "signalling.offer", "version": "0.5", "id": uuid::Uuid::new_v4().to_string(),
            "timestamp": "2026-01-06T12:00:00Z",
            "payload": {"robotId": ROBOT, "connectionId": session, "sdp": sdp, "sdpType": "offer"},
            "meta": {"session": meta},
        });
        let channel = format!("{}node:{}", self.prefix, self.node);
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(format!("J{open}"))
            .query_async(self.conn)
            .await
            .expect("PUBLISH open");
        let robot_conn = self.robot_conn;
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(format!("F{client_conn}\n{robot_conn}\n{session}\n{offer}"))
            .query_async(self.conn)
            .await
            .expect("PUBLISH offer");
    }
}

/// The robot's reply for `session`, relayed back to the made-up node.
async fn reply_for(
    replies: &mut (impl futures_util::Stream<Item = redis::Msg> + Unpin),
    session: &str,
) -> String {
    tokio::time::timeout(WAIT, async {
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
    .unwrap_or_else(|_| panic!("no reply from the robot for {session}"))
}

/// Offers' `meta.session` with whether the robot must take them: none, an
/// unsigned ticket, one for another session, and a good one (signed with
/// the deployment's key `der`, id `kid`).
fn cases(der: &[u8], kid: &str) -> Vec<(String, Value, bool)> {
    let encoding = EncodingKey::from_ed_der(der);
    let sign = |claims: &TicketClaims| {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.to_owned());
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
    vec![
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
    ]
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
    let prefix = format!("tickets-bus-{}:", uuid::Uuid::new_v4().simple());
    let node = format!("node-{}", uuid::Uuid::new_v4().simple());
    let database_url = database(&pg).await;
    // The deployment's key in a file, so that this test can sign as the server does.
    let rng = ring::rand::SystemRandom::new();
    let der = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
    let running = server::start(ADMIN, |config, dir| {
        let key_file = dir.join("signing-key.pem");
        std::fs::write(
            &key_file,
            pem::encode(&pem::Pem::new("PRIVATE KEY", der.as_ref().to_vec())),
        )
        .expect("write");
        config.database_url = Some(database_url);
        config.redis_url = Some(redis_url.clone());
        config.redis_prefix = prefix.clone();
        config.node_id = Some(node.clone());
        config.signing_key_file = Some(key_file);
    })
    .await;
    let (agent_dir, enrolled) = running.enroll(ROBOT).await;
    assert_eq!(enrolled.server_keys.len(), 1, "the server's key is pinned");
    let agent = running.agent(ROBOT, agent_dir, |_| {});

    // The robot's socket, as every node finds it: `robot:{id}` = node, connection.
    let client = redis::Client::open(redis_url.as_str()).expect("redis");
    let mut redis_conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let robot_conn = robot_connection(&mut redis_conn, &prefix, &node).await;

    // Listen as the made-up node: the robot's replies to "its" client come here.
    let mut pubsub = client.get_async_pubsub().await.expect("pubsub");
    pubsub
        .subscribe(format!("{prefix}node:{EVIL}"))
        .await
        .expect("subscribe");
    let mut replies = pubsub.into_on_message();

    let (pc, sdp) = offer_sdp(&["control"]).await;
    let cases = cases(der.as_ref(), &enrolled.server_keys[0]);
    for (session, meta, good) in cases {
        let bus = Bus {
            conn: &mut redis_conn,
            prefix: &prefix,
            node: &node,
            robot_conn: &robot_conn,
        };
        bus.offer(&session, meta, &sdp).await;
        let reply = reply_for(&mut replies, &session).await;
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
}
