//! Programs: each drives one robot through the ARP gateway, calling tools open loop with an
//! idempotency key per call, answering the robot's confirmations, and retrying a call that
//! got no answer or a retryable refusal with the same key on a new connection.

use std::collections::{HashMap, VecDeque};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use super::{heard, Backoff, Heard, Shared};

/// Tries per call (the first and the retries) before it is given up as unanswered.
const TRIES: u32 = 6;
/// How long a call may wait for its answer before the connection is given up.
const CALL_TIMEOUT: Duration = Duration::from_secs(8);

struct Call {
    key: String,
    tool: &'static str,
    tries: u32,
    last_code: Option<String>,
}

/// Runs one program against `robot_id` until the run stops, `rate` calls a second.
pub async fn run(shared: Arc<Shared>, robot_id: String, program: usize, rate: f64) {
    let books = &shared.books;
    let mut program = Program {
        shared: &shared,
        number: program,
        queue: VecDeque::new(),
        next: 0,
        backoff: Backoff::new(),
    };
    let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
    while !shared.stopping() {
        match connect(&shared, &robot_id).await {
            Ok(socket) => {
                let ended = session(&shared, socket, &mut program, period).await;
                books.count(&format!("arp.connection_ended.{ended}"));
            }
            Err(e) => {
                books.count("arp.connect_failed");
                books.error(&format!(
                    "arp_upgrade:{}",
                    e.chars().take(60).collect::<String>()
                ));
            }
        }
        if shared.stopping() {
            break;
        }
        program.backoff.wait(&shared).await;
    }
    // What was never answered nor refused, after its tries: the books' breach if any
    // try had no answer at all (a refusal with a code is an answer).
    for call in program.queue {
        match call.last_code {
            Some(code) => {
                books.count(&format!("arp.calls_refused_final.{code}"));
            }
            None if call.tries == 0 => books.count("arp.calls_not_sent_at_stop"),
            // Cut and waiting for its retry when the run stopped (the run leaves time to
            // recover before it stops, so the books show this as a count to read).
            None => books.count("arp.calls_awaiting_retry_at_stop"),
        }
    }
}

async fn connect(shared: &Shared, robot_id: &str) -> Result<super::target::Socket, String> {
    let url = shared
        .ws_url
        .replace("/ws", &format!("/v1/robots/{robot_id}/arp"));
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {}", shared.operator_token))
            .map_err(|e| e.to_string())?,
    );
    let (socket, _) = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_tungstenite::connect_async(request),
    )
    .await
    .map_err(|_| "timeout".to_string())?
    .map_err(|e| e.to_string())?;
    Ok(socket)
}

/// Retryable refusals: the call did not run, or ran and will be answered from the key.
fn retryable(code: i64, reason: &str) -> bool {
    matches!(
        (code, reason),
        (
            -32603,
            "robot_offline" | "session_ended" | "audit_unavailable" | "unavailable"
        ) | (-40001, "rate_limited")
            | (-40004, "robot_busy")
            | (-40005, _)
    )
}

type Sink = SplitSink<super::target::Socket, Message>;

/// One connection of a program: initializes, calls at its period, and hands the calls it
/// got no answer for back to the queue when it ends; says how it ended.
async fn session(
    shared: &Shared,
    socket: super::target::Socket,
    program: &mut Program<'_>,
    period: Duration,
) -> &'static str {
    let (mut sink, mut stream) = socket.split();
    let init = json!({"jsonrpc": "2.0", "id": "init", "method": "arp.initialize", "params": {
        "protocolVersion": "0.1.0", "clientInfo": {"name": "chaos", "version": "1"},
        "capabilities": {"confirmation": true}}});
    if sink.send(Message::text(init.to_string())).await.is_err() {
        return "send_failed";
    }
    let mut connection = Connection::new(shared.churn_deadline());
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut stop = shared.stop_signal();
    // After the stop: the answers still due, for a few seconds, then the end.
    let mut draining: Option<Instant> = None;
    let outcome = loop {
        if let Some(since) = draining {
            if connection.in_flight.is_empty() || since.elapsed() > Duration::from_secs(5) {
                break "stopped";
            }
        }
        let flow = tokio::select! {
            _ = stop.changed(), if draining.is_none() => {
                draining = Some(Instant::now());
                ControlFlow::Continue(())
            }
            // While draining, a tick only wakes the loop to see whether the time is up.
            _ = tick.tick() => match draining {
                Some(_) => ControlFlow::Continue(()),
                None => connection.call(program, &mut sink).await,
            },
            frame = stream.next() => match heard(&shared.books, frame, "program_got_bad_json") {
                Heard::Json(frame) => connection.on_frame(program, &frame, &mut sink).await,
                Heard::Nothing => ControlFlow::Continue(()),
                Heard::Ended(how) => ControlFlow::Break(how),
            },
        };
        if let ControlFlow::Break(how) = flow {
            break how;
        }
    };
    connection.hand_back(program, outcome);
    let _ = sink.close().await;
    outcome
}

/// What a program keeps over its connections.
struct Program<'a> {
    shared: &'a Shared,
    /// Which program: its calls' keys are `p{number}-{n}`.
    number: usize,
    /// Calls still to be answered (retries first).
    queue: VecDeque<Call>,
    /// The last call made.
    next: u64,
    backoff: Backoff,
}

impl Program<'_> {
    /// The next call: a retry, or a new one.
    fn next_call(&mut self) -> Call {
        self.queue.pop_front().unwrap_or_else(|| {
            self.next += 1;
            self.shared.books.count("arp.calls_new");
            Call {
                key: format!("p{}-{}", self.number, self.next),
                // One call in ten needs a confirmation (the robot asks the program).
                tool: if self.next.is_multiple_of(10) {
                    "navigate_to"
                } else {
                    "list_locations"
                },
                tries: 0,
                last_code: None,
            }
        })
    }
}

/// One connection's state.
struct Connection {
    /// Calls sent on this connection: JSON-RPC id → (call, sent at).
    in_flight: HashMap<u64, (Call, Instant)>,
    /// The last JSON-RPC id used.
    rpc: u64,
    /// Initialized.
    ready: bool,
    churn_at: Option<Instant>,
}

impl Connection {
    fn new(churn_at: Option<Instant>) -> Self {
        Connection {
            in_flight: HashMap::new(),
            rpc: 0,
            ready: false,
            churn_at,
        }
    }

    /// At a tick: the next call, unless the connection is to end (churn, a call that
    /// timed out) or has enough in flight.
    async fn call(
        &mut self,
        program: &mut Program<'_>,
        sink: &mut Sink,
    ) -> ControlFlow<&'static str> {
        let books = &program.shared.books;
        if !self.ready || self.in_flight.len() >= 12 {
            return ControlFlow::Continue(());
        }
        if self.churn_at.is_some_and(|at| Instant::now() >= at) && self.in_flight.is_empty() {
            books.count("arp.connections_churned");
            return ControlFlow::Break("churn");
        }
        if self
            .in_flight
            .values()
            .any(|(_, at)| at.elapsed() > CALL_TIMEOUT)
        {
            return ControlFlow::Break("call_timed_out");
        }
        let mut call = program.next_call();
        call.tries += 1;
        self.rpc += 1;
        let frame = json!({"jsonrpc": "2.0", "id": self.rpc, "method": "arp.callTool", "params": {
            "name": call.tool, "arguments": {}, "idempotencyKey": call.key}});
        if sink.send(Message::text(frame.to_string())).await.is_err() {
            program.queue.push_front(call);
            return ControlFlow::Break("send_failed");
        }
        books.count("arp.calls_sent");
        self.in_flight.insert(self.rpc, (call, Instant::now()));
        ControlFlow::Continue(())
    }

    /// A frame from the gateway: a confirmation to give, initialize's answer, or a call's.
    async fn on_frame(
        &mut self,
        program: &mut Program<'_>,
        frame: &Value,
        sink: &mut Sink,
    ) -> ControlFlow<&'static str> {
        let books = &program.shared.books;
        if frame["method"] == "arp.requestConfirmation" {
            let answer = json!({"jsonrpc": "2.0", "id": frame["id"], "result": {
                "confirmed": true, "confirmedBy": "chaos", "timestamp": "2026-01-01T00:00:00Z"}});
            if sink.send(Message::text(answer.to_string())).await.is_err() {
                return ControlFlow::Break("send_failed");
            }
            books.count("arp.confirmations_answered");
            return ControlFlow::Continue(());
        }
        if frame.get("method").is_some() {
            return ControlFlow::Continue(());
        }
        if frame["id"] == "init" {
            if let Some(error) = frame.get("error") {
                let code = error["code"].as_i64().unwrap_or(0);
                let reason = error["data"]["reason"].as_str().unwrap_or("");
                books.error(&format!("arp:{code}/{reason}"));
                books.count("arp.initialize_refused");
                return ControlFlow::Break("initialize_refused");
            }
            self.ready = true;
            program.backoff.reset();
            books.count("arp.sessions_opened");
            return ControlFlow::Continue(());
        }
        let Some(id) = frame["id"].as_u64() else {
            return ControlFlow::Continue(());
        };
        let Some((call, sent)) = self.in_flight.remove(&id) else {
            books.breach("program_got_an_answer_it_never_asked", frame.to_string());
            return ControlFlow::Continue(());
        };
        match frame.get("error") {
            Some(error) => refused(program, call, error, frame),
            None => {
                completed(program.shared, &call, sent, frame);
                ControlFlow::Continue(())
            }
        }
    }

    /// Calls without an answer on this connection go again (same key) on the next one.
    fn hand_back(self, program: &mut Program<'_>, outcome: &str) {
        let books = &program.shared.books;
        let mut unanswered: Vec<(u64, Call)> = self
            .in_flight
            .into_iter()
            .map(|(id, (call, _))| (id, call))
            .collect();
        unanswered.sort_by_key(|(id, _)| *id);
        for (_, mut call) in unanswered.into_iter().rev() {
            if outcome == "stopped" {
                books.count("arp.calls_in_flight_at_stop");
                continue;
            }
            if call.tries >= TRIES {
                books
                    .unanswered_keys
                    .lock()
                    .expect("keys")
                    .insert(call.key.clone());
                continue;
            }
            books.count("arp.calls_unanswered_on_connection");
            call.last_code = None;
            program.queue.push_front(call);
        }
    }
}

/// A call refused: retried if it may be, else refused for good; a refusal because the
/// session ended ends the connection.
fn refused(
    program: &mut Program<'_>,
    mut call: Call,
    error: &Value,
    frame: &Value,
) -> ControlFlow<&'static str> {
    let books = &program.shared.books;
    let code = error["code"].as_i64().unwrap_or(0);
    let reason = error["data"]["reason"].as_str().unwrap_or("").to_string();
    if code == 0 {
        books.breach("arp_refused_without_a_code", frame.to_string());
    }
    books.error(&format!("arp:{code}/{reason}"));
    call.last_code = Some(format!("{code}/{reason}"));
    if retryable(code, &reason) && call.tries < TRIES {
        books.count("arp.calls_retried");
        program.queue.push_back(call);
    } else {
        books.count(&format!("arp.calls_refused_final.{code}/{reason}"));
    }
    if reason == "session_ended" {
        return ControlFlow::Break("session_ended");
    }
    ControlFlow::Continue(())
}

/// A call answered: its round trip timed, its key completed.
fn completed(shared: &Shared, call: &Call, sent: Instant, frame: &Value) {
    let books = &shared.books;
    books.arp_rtt.record(sent.elapsed().as_nanos() as u64);
    if frame["result"]["state"] == "completed" {
        books.count("arp.calls_completed");
        books
            .completed_keys
            .lock()
            .expect("keys")
            .insert(format!("{}|{}", shared.operator_subject, call.key));
    } else {
        books.breach("arp_answer_without_completed_state", frame.to_string());
    }
}
