//! Session tickets: the checks one by one, then end to end through the real agent (a
//! scripted signalling server on 127.0.0.1:0 injects crafted offers and `arp.frame`s;
//! signalling client, peer manager, ARP server and sim driver are all real). A forged
//! ticket never moves the sim; a good one does.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use futures_util::SinkExt;
use jsonwebtoken::{EncodingKey, Header};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use signalling_protocol::arp::FRAME_TYPE;
use signalling_protocol::ticket::{KEY_EXCHANGE_META_KEY, SESSION_KEY_ID};
use signalling_protocol::Role;
use tokio_tungstenite::tungstenite::Message;

use super::*;
use crate::arp::ArpOptions;
use crate::server_keys::PinnedKey;
use crate::testutil;
use crate::testutil::arp::{fixture, until, Fixture};
use crate::testutil::browser::offer_sdp;
use crate::testutil::scripted::{self, envelope, next_text};

const ROBOT: &str = "robot-1";

/// A server signing key, as the server holds it.
struct Signer {
    encoding: EncodingKey,
    pinned: PinnedKey,
}

impl Signer {
    fn new() -> Signer {
        let rng = ring::rand::SystemRandom::new();
        let der = Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
        let pair = Ed25519KeyPair::from_pkcs8(der.as_ref()).expect("pair");
        let x = URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
        Signer {
            encoding: EncodingKey::from_ed_der(der.as_ref()),
            pinned: PinnedKey::from_x(&x).expect("pinned"),
        }
    }

    /// Signs `claims`, naming key `kid` in the header.
    fn sign_as(&self, kid: &str, claims: &TicketClaims) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign")
    }

    fn sign(&self, claims: &TicketClaims) -> String {
        self.sign_as(&self.pinned.kid, claims)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn claims(connection: &str, role: Role) -> TicketClaims {
    TicketClaims {
        robot: ROBOT.into(),
        connection_id: connection.into(),
        subject: "alice".into(),
        role,
        node: "node-1".into(),
        iat: now(),
        exp: now() + 120,
        jti: Some(uuid::Uuid::new_v4().to_string()),
        call_id: None,
        params_hash: None,
        kx: None,
    }
}

/// The claims of one ARP frame, as the server's gateway makes them.
fn frame_claims(connection: &str, role: Role, frame: &Value) -> TicketClaims {
    let mut c = claims(connection, role);
    c.call_id = frame.get("id").cloned();
    if is_tool_call(frame) {
        c.params_hash = Some(params_hash(frame.get("params")));
    }
    c
}

fn meta(role: &str, ticket: Option<String>) -> SessionMeta {
    let mut session = SessionMeta::new("alice", Role::parse(role).expect("role"));
    session.ticket = ticket;
    session
}

#[test]
fn a_good_ticket_gives_its_own_subject_and_role_not_the_plain_meta() {
    let signer = Signer::new();
    let check = TicketCheck::new(ROBOT, std::slice::from_ref(&signer.pinned)).expect("check");
    let ticket = signer.sign(&claims("c1", Role::Viewer));
    // meta.session.role says owner: rewritten on the way; the ticket says viewer.
    let vouched = check
        .offer(Some(&meta("owner", Some(ticket))), "c1")
        .expect("accepted");
    assert_eq!(vouched.session.role, Role::Viewer);
    assert_eq!(vouched.session.subject, "alice");
}

#[test]
fn every_forgery_of_an_offer_ticket_is_refused_with_its_reason() {
    let signer = Signer::new();
    let other = Signer::new();
    let check = TicketCheck::new(ROBOT, std::slice::from_ref(&signer.pinned)).expect("check");
    let offer = |ticket: Option<String>| check.offer(Some(&meta("operator", ticket)), "c1");
    assert_eq!(offer(None), Err(TicketError::Missing));
    assert!(matches!(
        offer(Some("not.a.jws".into())),
        Err(TicketError::Malformed(_))
    ));
    // Right shape, no signature: `alg: none` is never accepted.
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims("c1", Role::Owner)).unwrap());
    let unsigned = format!(
        "{}.{payload}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#)
    );
    assert!(offer(Some(unsigned)).is_err());
    // A key we never pinned, under its own id or under ours.
    let foreign = other.sign(&claims("c1", Role::Owner));
    assert!(matches!(
        offer(Some(foreign)),
        Err(TicketError::UnknownKey(_))
    ));
    let wrong_signature = other.sign_as(&signer.pinned.kid, &claims("c1", Role::Owner));
    assert!(matches!(
        offer(Some(wrong_signature)),
        Err(TicketError::Invalid(_))
    ));
    // A good viewer ticket whose payload was upgraded to owner: the signature breaks.
    let good = signer.sign(&claims("c1", Role::Viewer));
    let parts: Vec<&str> = good.split('.').collect();
    let upgraded = format!("{}.{payload}.{}", parts[0], parts[2]);
    assert!(matches!(
        offer(Some(upgraded)),
        Err(TicketError::Invalid(_))
    ));
    let mut for_another = claims("c1", Role::Owner);
    for_another.robot = "robot-2".into();
    assert_eq!(
        offer(Some(signer.sign(&for_another))),
        Err(TicketError::OtherRobot("robot-2".into()))
    );
    let mut expired = claims("c1", Role::Owner);
    expired.iat = now() - 600;
    expired.exp = now() - 300;
    assert_eq!(
        offer(Some(signer.sign(&expired))),
        Err(TicketError::Expired)
    );
    let mut forever = claims("c1", Role::Owner);
    forever.exp = now() + 86_400;
    assert_eq!(
        offer(Some(signer.sign(&forever))),
        Err(TicketError::TooLong)
    );
    let elsewhere = signer.sign(&claims("c2", Role::Owner));
    assert_eq!(
        offer(Some(elsewhere)),
        Err(TicketError::OtherSession("c2".into()))
    );
}

#[test]
fn an_arp_ticket_is_bound_to_its_call_and_its_params() {
    let signer = Signer::new();
    let check = TicketCheck::new(ROBOT, std::slice::from_ref(&signer.pinned)).expect("check");
    let call =
        json!({"jsonrpc": "2.0", "id": 7, "method": "arp.callTool", "params": drive(0.2, 0.3)});
    let ticket = signer.sign(&frame_claims("a1", Role::Operator, &call));
    let with =
        |frame: &Value| check.arp_frame(Some(&meta("operator", Some(ticket.clone()))), "a1", frame);
    assert_eq!(with(&call).expect("accepted").role, Role::Operator);
    let mut faster = call.clone();
    faster["params"] = drive(2.0, 30.0);
    assert_eq!(with(&faster), Err(TicketError::OtherParams));
    let mut other_id = call.clone();
    other_id["id"] = json!(8);
    assert_eq!(with(&other_id), Err(TicketError::OtherCall));
    // Taken once: the same call again, ticket and all, is a replay.
    assert_eq!(with(&call), Err(TicketError::Replayed));
}

#[test]
fn a_ticket_is_good_once_and_one_without_an_id_never() {
    let signer = Signer::new();
    let check = TicketCheck::new(ROBOT, std::slice::from_ref(&signer.pinned)).expect("check");
    let offer = |ticket: String| check.offer(Some(&meta("operator", Some(ticket))), "c1");
    let ticket = signer.sign(&claims("c1", Role::Operator));
    assert!(offer(ticket.clone()).is_ok());
    assert_eq!(offer(ticket), Err(TicketError::Replayed));
    // A refused message does not use its ticket up: the one it was minted for still
    // passes after a copy was tried in another session.
    let ticket = signer.sign(&claims("c1", Role::Operator));
    assert!(check
        .offer(Some(&meta("operator", Some(ticket.clone()))), "c2")
        .is_err());
    assert!(offer(ticket).is_ok());
    for jti in [None, Some(String::new())] {
        let mut anonymous = claims("c1", Role::Operator);
        anonymous.jti = jti;
        assert_eq!(offer(signer.sign(&anonymous)), Err(TicketError::NoId));
    }
}

#[test]
fn during_a_rotation_tickets_of_both_pinned_keys_are_accepted() {
    let old = Signer::new();
    let new = Signer::new();
    let unknown = Signer::new();
    let check = TicketCheck::new(ROBOT, &[old.pinned.clone(), new.pinned.clone()]).expect("check");
    for signer in [&old, &new] {
        let ticket = signer.sign(&claims("c1", Role::Operator));
        assert!(check
            .offer(Some(&meta("operator", Some(ticket))), "c1")
            .is_ok());
    }
    let ticket = unknown.sign(&claims("c1", Role::Operator));
    assert!(check
        .offer(Some(&meta("operator", Some(ticket))), "c1")
        .is_err());
}

#[test]
fn no_pinned_key_means_no_check() {
    assert!(TicketCheck::new(ROBOT, &[]).is_none());
}

// --- end to end ---------------------------------------------------------------

struct Rig {
    f: Fixture,
    agent: scripted::Agent,
    signer: Signer,
    check: Arc<TicketCheck>,
}

fn drive(linear: f64, secs: f64) -> Value {
    json!({"name": "drive", "arguments": {"linear": linear, "angular": 0.0, "durationSecs": secs}})
}

/// The real agent, pinned to a fresh server key, logged in to a scripted server.
async fn rig() -> Rig {
    let f = fixture(ArpOptions::default()).await;
    let signer = Signer::new();
    let check =
        Arc::new(TicketCheck::new(ROBOT, std::slice::from_ref(&signer.pinned)).expect("check"));
    let shared = testutil::shared(f.controller.clone(), None);
    let agent = scripted::agent(ROBOT, shared, f.server.clone(), Some(check.clone())).await;
    Rig {
        f,
        agent,
        signer,
        check,
    }
}

impl Rig {
    /// Injects one `arp.frame` with `meta.session = session` (as anything in the path
    /// could) and returns the robot's answer to it.
    async fn inject(&mut self, connection: &str, session: Value, frame: Value) -> Value {
        self.inject_for_envelope(connection, session, frame).await["payload"]["frame"].clone()
    }

    /// As [`Rig::inject`], the whole `arp.frame` that carries the answer.
    async fn inject_for_envelope(
        &mut self,
        connection: &str,
        session: Value,
        frame: Value,
    ) -> Value {
        let id = frame["id"].clone();
        let mut message = envelope(
            FRAME_TYPE,
            json!({"connectionId": connection, "frame": frame}),
        );
        message["meta"] = json!({ "session": session });
        self.agent
            .ws
            .send(Message::text(message.to_string()))
            .await
            .expect("send");
        loop {
            let v = next_text(&mut self.agent.ws).await;
            let answer = &v["payload"]["frame"];
            if v["type"] == FRAME_TYPE && answer["id"] == id && answer.get("method").is_none() {
                return v;
            }
        }
    }

    /// A frame with a ticket as the server mints it.
    async fn signed(&mut self, connection: &str, role: Role, frame: Value) -> Value {
        let ticket = self.signer.sign(&frame_claims(connection, role, &frame));
        let session = json!({"subject": "alice", "role": role.as_str(), "ticket": ticket});
        self.inject(connection, session, frame).await
    }
}

fn request(id: &str, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn initialize(id: &str) -> Value {
    request(
        id,
        "arp.initialize",
        json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "tickets-test", "version": "1"}}),
    )
}

fn assert_bad_ticket(answer: &Value) {
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "bad_ticket", "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_arp_tickets_never_move_the_sim_and_a_good_one_does() {
    let mut r = rig().await;
    let c = "arp-forged";
    let init = r.signed(c, Role::Operator, initialize("i1")).await;
    assert!(init.get("error").is_none(), "{init}");

    let call = |id: &str| request(id, "arp.callTool", drive(0.3, 0.3));
    let other = Signer::new();
    let mut forged: Vec<(&str, Value)> = Vec::new();
    forged.push(("no ticket", json!({"subject": "alice", "role": "owner"})));
    forged.push((
        "an unsigned ticket",
        json!({"subject": "alice", "role": "owner", "ticket": format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&frame_claims(c, Role::Owner, &call("f2"))).unwrap())
        )}),
    ));
    forged.push((
        "a wrong signature",
        json!({"subject": "alice", "role": "owner",
               "ticket": other.sign_as(&r.signer.pinned.kid, &frame_claims(c, Role::Owner, &call("f3")))}),
    ));
    let mut for_another = frame_claims(c, Role::Owner, &call("f4"));
    for_another.robot = "robot-2".into();
    forged.push((
        "another robot's ticket",
        json!({"subject": "alice", "role": "owner", "ticket": r.signer.sign(&for_another)}),
    ));
    let mut expired = frame_claims(c, Role::Owner, &call("f5"));
    expired.iat = now() - 600;
    expired.exp = now() - 300;
    forged.push((
        "an expired ticket",
        json!({"subject": "alice", "role": "owner", "ticket": r.signer.sign(&expired)}),
    ));
    // A good ticket for a slow drive, sent with a fast one.
    let mut slow = frame_claims(
        c,
        Role::Operator,
        &request("f6", "arp.callTool", drive(0.01, 0.1)),
    );
    slow.call_id = Some(json!("f6"));
    forged.push((
        "a ticket for other params",
        json!({"subject": "alice", "role": "operator", "ticket": r.signer.sign(&slow)}),
    ));
    for (i, (what, session)) in forged.into_iter().enumerate() {
        let id = format!("f{}", i + 1);
        let answer = r.inject(c, session, call(&id)).await;
        assert_bad_ticket(&answer);
        let state = r.f.probe.state();
        assert!(
            state.x == 0.0 && state.linear == 0.0,
            "{what} moved the sim: {state:?}"
        );
    }
    // Role upgraded in the plain meta: a viewer's good ticket, "owner" beside it.
    let upgraded = request("u1", "arp.callTool", drive(0.3, 0.3));
    let ticket = r.signer.sign(&frame_claims(c, Role::Viewer, &upgraded));
    let answer = r
        .inject(
            c,
            json!({"subject": "alice", "role": "owner", "ticket": ticket}),
            upgraded,
        )
        .await;
    // The session opened as an operator; a frame whose ticket says viewer is refused.
    assert!(answer.get("error").is_some(), "{answer}");
    assert_eq!(r.f.probe.state().x, 0.0, "an upgraded role moved the sim");
    assert_eq!(r.check.refused(), 6);

    let done = r.signed(c, Role::Operator, call("ok")).await;
    assert_eq!(done["result"]["state"], "completed", "{done}");
    until(&r.f.probe, "stopped after the drive", |s| s.linear == 0.0).await;
    let x = r.f.probe.state().x;
    assert!(x > 0.05, "the good ticket moved the sim: x = {x}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_ticket_under_an_owner_meta_opens_a_viewer_session_that_cannot_drive() {
    let mut r = rig().await;
    let c = "arp-viewer";
    let init = initialize("i1");
    let ticket = r.signer.sign(&frame_claims(c, Role::Viewer, &init));
    let session = json!({"subject": "alice", "role": "owner", "ticket": ticket});
    let opened = r.inject(c, session, init).await;
    assert!(opened.get("error").is_none(), "{opened}");
    let drive_call = request("d1", "arp.callTool", drive(0.3, 0.3));
    let ticket = r.signer.sign(&frame_claims(c, Role::Viewer, &drive_call));
    let session = json!({"subject": "alice", "role": "owner", "ticket": ticket});
    let answer = r.inject(c, session, drive_call).await;
    assert_eq!(answer["error"]["data"]["reason"], "forbidden", "{answer}");
    assert_eq!(r.f.probe.state().x, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emergency_stop_needs_no_ticket() {
    let mut r = rig().await;
    let stop =
        json!({"jsonrpc": "2.0", "method": "arp.emergencyStop", "params": {"reason": "test"}});
    let mut message = envelope(
        FRAME_TYPE,
        json!({"connectionId": "estop-1", "frame": stop}),
    );
    message["meta"] = json!({"session": {"subject": "api", "role": "owner"}});
    r.agent
        .ws
        .send(Message::text(message.to_string()))
        .await
        .expect("send");
    until(&r.f.probe, "the e-stop reached the sim", |s| {
        s.last_stop.is_some()
    })
    .await;
    assert_eq!(r.check.refused(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_without_a_good_ticket_is_refused_and_one_with_it_is_answered() {
    let mut r = rig().await;
    let (pc, sdp) = offer_sdp(&["control"]).await;
    let offer = |connection: &str, session: Value| {
        let mut m = envelope(
            "signalling.offer",
            json!({"robotId": ROBOT, "connectionId": connection, "sdp": sdp, "sdpType": "offer"}),
        );
        m["meta"] = json!({ "session": session });
        m.to_string()
    };
    let foreign = Signer::new().sign(&claims("s1", Role::Owner));
    let other_session = r.signer.sign(&claims("s-other", Role::Owner));
    for (connection, session) in [
        ("s1", json!({"subject": "alice", "role": "owner"})),
        (
            "s1",
            json!({"subject": "alice", "role": "owner", "ticket": foreign}),
        ),
        (
            "s1",
            json!({"subject": "alice", "role": "owner", "ticket": other_session}),
        ),
    ] {
        r.agent
            .ws
            .send(Message::text(offer(connection, session)))
            .await
            .expect("send");
        let refused = next_text(&mut r.agent.ws).await;
        assert_eq!(refused["type"], "signalling.disconnected", "{refused}");
        assert_eq!(refused["payload"]["details"]["reason"], "bad_ticket");
    }
    assert_eq!(r.check.refused(), 3);
    let ticket = r.signer.sign(&claims("s2", Role::Operator));
    let session = json!({"subject": "alice", "role": "operator", "ticket": ticket});
    r.agent
        .ws
        .send(Message::text(offer("s2", session)))
        .await
        .expect("send");
    loop {
        let v = next_text(&mut r.agent.ws).await;
        assert_ne!(v["type"], "signalling.disconnected", "{v}");
        if v["type"] == "signalling.answer" {
            assert_eq!(v["payload"]["connectionId"], "s2");
            break;
        }
    }
    pc.close().await.expect("close");
}

/// Claims that a robot still takes for about `secs` seconds (exp lies in the leeway).
fn lapsing(connection: &str, role: Role, secs: u64) -> TicketClaims {
    let mut c = claims(connection, role);
    c.exp = now() + secs - LEEWAY_SECS;
    c.iat = c.exp - 60;
    c
}

impl Rig {
    /// Sends an offer for `connection` with `ticket` and waits for the robot's answer.
    async fn open(&mut self, sdp: &str, connection: &str, role: Role, ticket: String) {
        let mut m = envelope(
            "signalling.offer",
            json!({"robotId": ROBOT, "connectionId": connection, "sdp": sdp, "sdpType": "offer"}),
        );
        m["meta"] =
            json!({"session": {"subject": "alice", "role": role.as_str(), "ticket": ticket}});
        self.agent
            .ws
            .send(Message::text(m.to_string()))
            .await
            .expect("send");
        loop {
            let v = next_text(&mut self.agent.ws).await;
            assert_ne!(v["type"], "signalling.disconnected", "{v}");
            if v["type"] == "signalling.answer" && v["payload"]["connectionId"] == connection {
                return;
            }
        }
    }

    /// A `session.ticket` for `connection`, as the server renews it.
    async fn renew(&mut self, connection: &str, role: Role, ticket: String) {
        let mut m = envelope("session.ticket", json!({"connectionId": connection}));
        m["meta"] =
            json!({"session": {"subject": "alice", "role": role.as_str(), "ticket": ticket}});
        self.agent
            .ws
            .send(Message::text(m.to_string()))
            .await
            .expect("send");
    }

    /// The next `disconnected` the robot sends (other messages skipped).
    async fn next_disconnected(&mut self) -> Value {
        loop {
            let v = next_text(&mut self.agent.ws).await;
            if v["type"] == "signalling.disconnected" {
                return v;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_ticket_runs_out_unrenewed_ends_and_gives_control_back() {
    let mut r = rig().await;
    let (pc, sdp) = offer_sdp(&["control"]).await;
    let ticket = r.signer.sign(&lapsing("s-lapse", Role::Operator, 2));
    r.open(&sdp, "s-lapse", Role::Operator, ticket).await;
    // The teleop session holds control: a program cannot take the robot.
    let busy = r.signed("arp-1", Role::Operator, initialize("i1")).await;
    assert_eq!(busy["error"]["data"]["reason"], "robot_busy", "{busy}");
    // A renewal signed by a key the robot never pinned changes nothing.
    let forged = Signer::new().sign(&claims("s-lapse", Role::Operator));
    r.renew("s-lapse", Role::Operator, forged).await;

    let ended = r.next_disconnected().await;
    assert_eq!(ended["payload"]["connectionId"], "s-lapse", "{ended}");
    assert_eq!(
        ended["payload"]["details"]["reason"], "ticket_expired",
        "{ended}"
    );
    assert_eq!(r.check.refused(), 1);
    // Control is free again.
    let init = r.signed("arp-2", Role::Operator, initialize("i2")).await;
    assert!(init.get("error").is_none(), "{init}");
    pc.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_session_outlives_its_first_ticket() {
    let mut r = rig().await;
    let (pc, sdp) = offer_sdp(&["control"]).await;
    let (pc2, sdp2) = offer_sdp(&["control"]).await;
    let ticket = r.signer.sign(&lapsing("s-kept", Role::Viewer, 2));
    r.open(&sdp, "s-kept", Role::Viewer, ticket).await;
    let fresh = r.signer.sign(&claims("s-kept", Role::Viewer));
    r.renew("s-kept", Role::Viewer, fresh.clone()).await;
    // A replay of the renewal is refused (and changes nothing either way).
    r.renew("s-kept", Role::Viewer, fresh).await;
    // A witness that lapses a second after the first ticket would have: by the time it
    // ends, the renewed session has outlived its first ticket.
    let witness = r.signer.sign(&lapsing("s-witness", Role::Viewer, 3));
    r.open(&sdp2, "s-witness", Role::Viewer, witness).await;
    let ended = r.next_disconnected().await;
    assert_eq!(ended["payload"]["connectionId"], "s-witness", "{ended}");
    assert_eq!(ended["payload"]["details"]["reason"], "ticket_expired");
    assert_eq!(r.check.refused(), 1, "the replayed renewal");

    // A renewal naming another role is no renewal: the session ends at once.
    let upgraded = r.signer.sign(&claims("s-kept", Role::Owner));
    r.renew("s-kept", Role::Owner, upgraded).await;
    let ended = r.next_disconnected().await;
    assert_eq!(ended["payload"]["connectionId"], "s-kept", "{ended}");
    assert_eq!(ended["payload"]["details"]["reason"], "bad_ticket");
    pc.close().await.expect("close");
    pc2.close().await.expect("close");
}

/// An endorsement of `endorsed`'s key, signed by `by` as the server signs one.
fn endorsement(by: &Signer, endorsed: &Signer) -> String {
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": endorsed.pinned.kid,
        "x": endorsed.pinned.x, "use": "sig", "alg": "EdDSA"});
    let claims = signalling_protocol::ticket::KeyEndorsement {
        endorses: vec![jwk],
        iat: now(),
    };
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(by.pinned.kid.clone());
    jsonwebtoken::encode(&header, &claims, &by.encoding).expect("sign")
}

#[test]
fn a_key_endorsed_by_a_pinned_one_is_pinned_and_nothing_else_is() {
    let old = Signer::new();
    let new = Signer::new();
    let stranger = Signer::new();
    let dir = crate::testutil::temp_dir("endorse");
    let file = dir.join(crate::server_keys::SERVER_KEYS_FILE);
    crate::server_keys::save(&file, std::slice::from_ref(&old.pinned)).expect("pin");
    let check = TicketCheck::new(ROBOT, std::slice::from_ref(&old.pinned))
        .expect("check")
        .with_keys_file(file.clone());
    let offer = |signer: &Signer| {
        let ticket = signer.sign(&claims("c1", Role::Operator));
        check.offer(Some(&meta("operator", Some(ticket))), "c1")
    };
    assert!(matches!(offer(&new), Err(TicketError::UnknownKey(_))));

    // Endorsed by a key we never pinned: refused, nothing pinned.
    assert!(matches!(
        check.endorse(&endorsement(&stranger, &new)),
        Err(TicketError::UnknownKey(_))
    ));
    // Our key's id over a stranger's signature: refused.
    let mut forged = endorsement(&stranger, &new);
    let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"EdDSA","kid":"{}"}}"#, old.pinned.kid));
    forged = format!("{header}.{}", forged.split_once('.').expect("JWS").1);
    assert!(matches!(
        check.endorse(&forged),
        Err(TicketError::Invalid(_))
    ));
    // A JWK whose kid is not its thumbprint: refused.
    let mut liar = new.pinned.clone();
    liar.kid = old.pinned.kid.clone();
    let lying = Signer {
        encoding: EncodingKey::from_ed_der(&[]),
        pinned: liar,
    };
    assert!(matches!(
        check.endorse(&endorsement(&old, &lying)),
        Err(TicketError::BadEndorsedKey(_))
    ));
    assert!(matches!(offer(&new), Err(TicketError::UnknownKey(_))));
    assert_eq!(crate::server_keys::load(&file).expect("load").len(), 1);

    // Endorsed by the pinned key: pinned, in memory and in the file, once.
    let added = check.endorse(&endorsement(&old, &new)).expect("endorsed");
    assert_eq!(added, vec![new.pinned.kid.clone()]);
    assert!(check
        .endorse(&endorsement(&old, &new))
        .expect("again")
        .is_empty());
    assert!(offer(&new).is_ok());
    assert!(offer(&old).is_ok(), "the old key stays trusted");
    let pinned = crate::server_keys::load(&file).expect("load");
    assert_eq!(pinned, vec![old.pinned.clone(), new.pinned.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_servers_endorsement_offers_signed_by_the_new_key_are_answered() {
    let mut r = rig().await;
    let (pc, sdp) = offer_sdp(&["control"]).await;
    let new = Signer::new();
    let m = envelope(
        "session.signing_keys",
        json!({"endorsement": endorsement(&r.signer, &new)}),
    );
    r.agent
        .ws
        .send(Message::text(m.to_string()))
        .await
        .expect("send");
    // Messages are handled in order: the offer after it sees the new key.
    let ticket = new.sign(&claims("s-new", Role::Viewer));
    r.open(&sdp, "s-new", Role::Viewer, ticket).await;
    assert_eq!(r.check.refused(), 0);
    pc.close().await.expect("close");
}

/// The server's side of an ARP session's key exchange, as the gateway does it.
struct ServerHalf {
    private: ring::agreement::EphemeralPrivateKey,
    public: String,
}

impl ServerHalf {
    fn new() -> ServerHalf {
        let rng = ring::rand::SystemRandom::new();
        let private =
            ring::agreement::EphemeralPrivateKey::generate(&ring::agreement::X25519, &rng)
                .expect("key");
        let public = URL_SAFE_NO_PAD.encode(private.compute_public_key().expect("public"));
        ServerHalf { private, public }
    }

    /// The session's MAC key, from the robot's half.
    fn agree(self, robot_half: &str, offered_in: &str, connection: &str) -> EncodingKey {
        let peer = ring::agreement::UnparsedPublicKey::new(
            &ring::agreement::X25519,
            URL_SAFE_NO_PAD.decode(robot_half).expect("base64url"),
        );
        let secret = ring::agreement::agree_ephemeral(self.private, &peer, |shared| {
            signalling_protocol::ticket::session_mac_key(shared, offered_in, connection)
        })
        .expect("an X25519 key");
        EncodingKey::from_secret(&secret)
    }
}

fn mac_ticket(key: &EncodingKey, claims: &TicketClaims) -> String {
    let mut header = Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some(SESSION_KEY_ID.into());
    jsonwebtoken::encode(&header, claims, key).expect("MAC")
}

/// The key exchange on `c`'s first ticket: the server's half in the
/// ticket, the robot's on its answer. Returns the session's MAC key.
async fn agree_a_session_key(r: &mut Rig, c: &str) -> EncodingKey {
    let server = ServerHalf::new();
    let mut offer = frame_claims(c, Role::Operator, &initialize("i1"));
    offer.kx = Some(server.public.clone());
    let offered_in = offer.jti.clone().expect("jti");
    let session = json!({"subject": "alice", "role": "operator", "ticket": r.signer.sign(&offer)});
    let answered = r.inject_for_envelope(c, session, initialize("i1")).await;
    assert!(
        answered["payload"]["frame"].get("error").is_none(),
        "{answered}"
    );
    // The robot's half rides on its answer, outside the ARP frame.
    let half = answered["meta"][KEY_EXCHANGE_META_KEY]
        .as_str()
        .unwrap_or_else(|| panic!("no ticketKey: {answered}"))
        .to_owned();
    server.agree(&half, &offered_in, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_first_tickets_key_exchange_macd_tickets_drive_and_forged_ones_never() {
    let mut r = rig().await;
    let c = "arp-keyed";
    let key = agree_a_session_key(&mut r, c).await;
    let mac = |role: Role, frame: &Value| {
        json!({"subject": "alice", "role": role.as_str(),
               "ticket": mac_ticket(&key, &frame_claims(c, role, frame))})
    };
    let call = |id: &str| request(id, "arp.callTool", drive(0.3, 0.3));

    // Forged MACs: another key, another session's, a role upgraded, a call's params swapped.
    let wrong_key = EncodingKey::from_secret(&[9; 32]);
    let forged = [
        json!({"subject": "alice", "role": "operator",
               "ticket": mac_ticket(&wrong_key, &frame_claims(c, Role::Operator, &call("m1")))}),
        json!({"subject": "alice", "role": "operator",
               "ticket": mac_ticket(&key, &frame_claims("arp-other", Role::Operator, &call("m2")))}),
        mac(Role::Owner, &call("m3")),
        mac(
            Role::Operator,
            &request("m4", "arp.callTool", drive(0.01, 0.1)),
        ),
    ];
    for (i, session) in forged.into_iter().enumerate() {
        let id = format!("m{}", i + 1);
        let answer = r.inject(c, session, call(&id)).await;
        assert!(
            answer.get("error").is_some(),
            "forgery {id} was taken: {answer}"
        );
        assert_eq!(r.f.probe.state().x, 0.0, "forgery {id} moved the sim");
    }
    // A session that never agreed a key takes no MAC'd ticket, even a good one of ours.
    let elsewhere = "arp-unkeyed";
    let init = r.signed(elsewhere, Role::Viewer, initialize("j1")).await;
    assert!(init.get("error").is_none(), "{init}");
    let stray = json!({"subject": "alice", "role": "viewer",
        "ticket": mac_ticket(&key, &frame_claims(elsewhere, Role::Viewer, &call("j2")))});
    assert_bad_ticket(&r.inject(elsewhere, stray, call("j2")).await);

    // The good one drives, once; its half is not sent again.
    let good = mac(Role::Operator, &call("ok"));
    let done = r.inject_for_envelope(c, good.clone(), call("ok")).await;
    assert_eq!(
        done["payload"]["frame"]["result"]["state"], "completed",
        "{done}"
    );
    assert!(done["meta"].get(KEY_EXCHANGE_META_KEY).is_none(), "{done}");
    until(&r.f.probe, "stopped after the drive", |s| s.linear == 0.0).await;
    let x = r.f.probe.state().x;
    assert!(x > 0.05, "the MAC'd ticket moved the sim: x = {x}");
    assert_bad_ticket(&r.inject(c, good, call("ok")).await);
    // Signed tickets are still taken in a keyed session.
    let signed = r
        .signed(c, Role::Operator, request("s1", "arp.listTools", json!({})))
        .await;
    assert!(signed.get("error").is_none(), "{signed}");

    // Once the session ends, its key is gone.
    let end = envelope(
        "signalling.disconnected",
        json!({"connectionId": c, "reason": "closed"}),
    );
    scripted::send(&mut r.agent.ws, &end).await;
    let again = mac(Role::Operator, &initialize("i2"));
    assert_bad_ticket(&r.inject(c, again, initialize("i2")).await);
}
