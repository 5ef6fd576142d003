//! The ARP conformance runner against the robot agent's own ARP server
//! (in process, sim driver, local WebSocket on 127.0.0.1:0), and the
//! Python example client against the same.

use std::time::Duration;

use agent_server_tests::arp_runner as runner;
use robot_agent::arp::ArpOptions;
use robot_agent::testutil::arp::{fixture, secret, OPERATOR, VIEWER};

#[path = "../../arp-bridge/tests/support/python.rs"]
mod python;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_robot_agent_passes_the_arp_conformance_run() {
    let agent = fixture(ArpOptions::default()).await;
    let report = runner::run(&runner::Options {
        url: agent.url.clone(),
        operator_token: Some(secret(OPERATOR).into()),
        viewer_token: Some(secret(VIEWER).into()),
        motion: true,
        estop: true,
    })
    .await;
    report.assert_passed();
    assert!(report.frames > 50, "{} frames validated", report.frames);
    assert!(
        agent.probe.state().x > 0.0,
        "the motion checks moved the sim"
    );
}

/// `examples/arp_square.py` (Python, `websockets` only) against the agent.
/// Skipped, saying so, where python3 or its `websockets` package is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_drives_a_square_and_e_stops() {
    if !python::has_module("websockets", "pip install websockets").await {
        return;
    }
    let agent = fixture(ArpOptions::default()).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/arp_square.py");
    let args = [
        agent.url.as_str(),
        "--token",
        secret(OPERATOR),
        "--side",
        "0.3",
        "--speed",
        "0.3",
    ];
    let stdout = python::run(script, &args, &[], Duration::from_secs(120)).await;
    assert!(stdout.contains("emergency stop latched"), "{stdout}");
    let s = agent.probe.state();
    // Four sides and four quarter turns: back near the start.
    assert!(
        s.x.abs() < 0.15 && s.y.abs() < 0.15,
        "ended at {s:?}\n{stdout}"
    );
    assert_eq!(s.last_stop.as_deref(), Some("emergency_stop"));
}
