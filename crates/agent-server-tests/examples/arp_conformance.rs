//! `cargo run -p agent-server-tests --example arp-conformance -- URL [options]`:
//! runs the ARP conformance checks against any endpoint.
//!
//! Options: `--operator-token T`, `--viewer-token T`, `--motion` (moves
//! the robot a few centimetres), `--estop` (latches and resets an e-stop).
//! Exit status 1 when a check fails.

use agent_server_tests::arp_runner as runner;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut options = runner::Options::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--operator-token" => options.operator_token = args.next(),
            "--viewer-token" => options.viewer_token = args.next(),
            "--motion" => options.motion = true,
            "--estop" => options.estop = true,
            "-h" | "--help" => {
                eprintln!("usage: arp-conformance URL [--operator-token T] [--viewer-token T] [--motion] [--estop]");
                return;
            }
            url if options.url.is_empty() && !url.starts_with("--") => options.url = url.to_owned(),
            other => {
                eprintln!("unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    if options.url.is_empty() {
        eprintln!("usage: arp-conformance URL [--operator-token T] [--viewer-token T] [--motion] [--estop]");
        std::process::exit(2);
    }
    let report = runner::run(&options).await;
    for check in &report.checks {
        match &check.outcome {
            Ok(()) => println!("ok    {}", check.name),
            Err(e) => println!("FAIL  {}: {e}", check.name),
        }
    }
    println!("{} frames validated against the ARP schema", report.frames);
    let failures = report.failures();
    if !failures.is_empty() {
        eprintln!(
            "{} of {} checks failed",
            failures.len(),
            report.checks.len()
        );
        std::process::exit(1);
    }
}
