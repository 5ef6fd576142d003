//! Confirmations routed to people: when the robot asks for a person's approval and the
//! program did not say it answers these itself, the request is written to the database,
//! where the console of the robot's operators and owners finds it (any node), and the
//! gateway watches for the first answer until the request expires (then the robot's own
//! timeout answers the call with -40005).

use std::time::Duration;

use serde_json::Value;
use signalling_protocol::arp::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::state::SharedState;
use crate::store::{bounded, Confirmation, Decision, MAX_PARAMS_BYTES};

/// Requests a connection may have waiting for people at once; more are denied.
const WAITING: usize = 4;
/// How often a waiting request is looked up. The answer comes from a person, in seconds:
/// a fifth of a second more is not noticed, and the database sees a handful of reads.
const POLL: Duration = Duration::from_millis(200);
/// Bounds on the robot's `timeout` (seconds).
const TIMEOUT_DEFAULT: f64 = 30.0;
const TIMEOUT_MAX: f64 = 300.0;

/// What became of a request.
pub enum Outcome {
    Decided(Decision),
    /// Nobody answered in time: the robot's own timeout answers the call.
    Expired,
    /// It could not be put where people see it: denied (fail closed).
    Failed,
}

pub struct Answered {
    /// The robot's request id, to answer it.
    pub request_id: Value,
    pub tool: Option<String>,
    pub outcome: Outcome,
}

/// The requests of one gateway connection that wait for people.
pub struct People {
    tx: mpsc::Sender<Answered>,
    rx: mpsc::Receiver<Answered>,
    tasks: Vec<JoinHandle<()>>,
}

impl People {
    pub fn new() -> People {
        let (tx, rx) = mpsc::channel(WAITING);
        People {
            tx,
            rx,
            tasks: Vec::new(),
        }
    }

    /// Puts the robot's `arp.requestConfirmation` before people; false when too many
    /// already wait (the caller denies it).
    pub fn ask(
        &mut self,
        state: &SharedState,
        robot_id: &str,
        session_id: &str,
        requested_by: &str,
        request: &Message,
    ) -> bool {
        self.tasks.retain(|task| !task.is_finished());
        if self.tasks.len() >= WAITING {
            return false;
        }
        let Some(request_id) = request.id.clone() else {
            return false;
        };
        let params = request.params().unwrap_or(&Value::Null);
        let timeout = params["timeout"]
            .as_f64()
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(TIMEOUT_DEFAULT)
            .min(TIMEOUT_MAX);
        let now = crate::store::now_ms();
        let tool = params
            .pointer("/details/tool")
            .and_then(Value::as_str)
            .map(str::to_string);
        let confirmation = Confirmation {
            id: uuid::Uuid::new_v4().to_string(),
            robot_id: robot_id.to_string(),
            session_id: session_id.to_string(),
            requested_by: requested_by.to_string(),
            action: bounded(params["action"].as_str().unwrap_or(""), 512),
            tool: tool.clone(),
            arguments: params
                .pointer("/details/arguments")
                .map(|a| bounded(&a.to_string(), MAX_PARAMS_BYTES)),
            safety_level: params["safetyLevel"].as_str().map(|s| bounded(s, 64)),
            created_at: now,
            expires_at: now + (timeout * 1000.0) as i64,
        };
        let state = state.clone();
        let tx = self.tx.clone();
        self.tasks.push(tokio::spawn(async move {
            let outcome = wait_for_people(&state, &confirmation).await;
            let _ = tx
                .send(Answered {
                    request_id,
                    tool,
                    outcome,
                })
                .await;
        }));
        true
    }

    /// The next answer; never resolves while nothing waits.
    pub async fn next(&mut self) -> Answered {
        match self.rx.recv().await {
            Some(answered) => answered,
            // The sender lives in `self`: never reached.
            None => std::future::pending().await,
        }
    }
}

impl Drop for People {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn wait_for_people(state: &SharedState, confirmation: &Confirmation) -> Outcome {
    if let Err(e) = state.store.add_confirmation(confirmation).await {
        tracing::error!(error = %e, "cannot put a confirmation before people; denied");
        return Outcome::Failed;
    }
    tracing::info!(confirmation = %confirmation.id, robot = %confirmation.robot_id, "confirmation waiting for people");
    loop {
        match state.store.decision(&confirmation.id).await {
            Ok(Some(decision)) => return Outcome::Decided(decision),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read a confirmation's answer"),
        }
        if crate::store::now_ms() >= confirmation.expires_at {
            return Outcome::Expired;
        }
        tokio::time::sleep(POLL).await;
    }
}
