//! What one session ticket costs at each end, for docs/benchmarks.md: the server minting
//! one (`signalling_server::tickets::Tickets`, as for every offer and gateway ARP frame)
//! and robot-agent checking one (`robot_agent::tickets::TicketCheck`, signature, claims and
//! replay memory), for signed tickets and for tickets MAC'd with an ARP session's key
//! (after its key exchange). Prints µs per ticket over N tickets (default 20,000); asserts
//! nothing.
//!
//! `cargo run --release -p agent-server-tests --example ticket_cost -- [N]`

use std::time::Instant;

use robot_agent::server_keys::PinnedKey;
use robot_agent::tickets::TicketCheck;
use serde_json::json;
use signalling_protocol::{Role, SessionMeta};
use signalling_server::pki::SigningKeys;
use signalling_server::tickets::{SessionKey, TicketFor, Tickets};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let pem = SigningKeys::generate_pem().expect("key");
    let keys = SigningKeys::from_pkcs8_pem(pem.as_bytes(), "bench.pem".as_ref()).expect("key");
    let jwk = serde_json::to_value(&keys.jwks().keys[0]).expect("jwk");
    let tickets = Tickets::new(keys, "bench-node".into());
    let check =
        TicketCheck::new("robot-1", &[PinnedKey::from_jwk(&jwk).expect("pin")]).expect("check");
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "arp.callTool",
        "params": {"name": "drive", "arguments": {"linear": 0.2, "angular": 0.0}}});
    let session = |i: usize| format!("arp-{i}");

    let start = Instant::now();
    let minted: Vec<String> = (0..n)
        .map(|i| {
            let id = session(i);
            tickets
                .arp_frame(
                    TicketFor {
                        robot: "robot-1",
                        connection_id: &id,
                        subject: "planner",
                        role: Role::Operator,
                    },
                    &call,
                    &mut SessionKey::Signed,
                )
                .expect("minted")
        })
        .collect();
    let mint = start.elapsed();

    let start = Instant::now();
    for (i, ticket) in minted.into_iter().enumerate() {
        let mut meta = SessionMeta::new("planner", Role::Operator);
        meta.ticket = Some(ticket);
        check
            .arp_frame(Some(&meta), &session(i), &call)
            .expect("checks");
    }
    let verify = start.elapsed();
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!("# session ticket cost, {n} tickets (ARP tool call: call id and params hash)");
    println!("server mints one:      {:.1} µs", per(mint));
    println!("robot checks one:      {:.1} µs", per(verify));
    // The floor: the Ed25519 signature alone (ring), over a ticket-sized message.
    println!("of which the signature: {:.1} µs", per(signature_alone(n)));

    // One ARP session whose key was agreed on its first ticket, as the gateway and the
    // agent do it; then N tool calls with MAC'd tickets.
    let (mint, verify) = mac_tickets(&tickets, &check, &call, n);
    println!("# the same, MAC'd with the ARP session's key (HS256)");
    println!("server mints one:      {:.1} µs", per(mint));
    println!("robot checks one:      {:.1} µs", per(verify));
}

/// N Ed25519 signatures (ring) over a ticket-sized message.
fn signature_alone(n: usize) -> std::time::Duration {
    let rng = ring::rand::SystemRandom::new();
    let der = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(der.as_ref()).expect("key");
    let message = vec![b'x'; 300];
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(pair.sign(&message));
    }
    start.elapsed()
}

/// Minting and checking N tickets MAC'd with a session's agreed key.
fn mac_tickets(
    tickets: &Tickets,
    check: &TicketCheck,
    call: &serde_json::Value,
    n: usize,
) -> (std::time::Duration, std::time::Duration) {
    let id = "arp-keyed";
    let who = TicketFor {
        robot: "robot-1",
        connection_id: id,
        subject: "planner",
        role: Role::Operator,
    };
    let mut key = tickets.session_key();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "arp.initialize", "params": {}});
    let mut meta = SessionMeta::new("planner", Role::Operator);
    meta.ticket = tickets.arp_frame(who, &initialize, &mut key);
    check
        .arp_frame(Some(&meta), id, &initialize)
        .expect("checks");
    let half = check.unsent_key_half(id).expect("the agent's half");
    assert!(key.agree(&half, id), "agreed");
    let start = Instant::now();
    let minted: Vec<String> = (0..n)
        .map(|_| tickets.arp_frame(who, call, &mut key).expect("minted"))
        .collect();
    let mint = start.elapsed();
    let start = Instant::now();
    for ticket in minted {
        let mut meta = SessionMeta::new("planner", Role::Operator);
        meta.ticket = Some(ticket);
        check.arp_frame(Some(&meta), id, call).expect("checks");
    }
    let verify = start.elapsed();
    (mint, verify)
}
