//! When the gateway ends the ARP connection because its token ended (revoked or expired:
//! close code 4003), the bridge stays: an expiring token must not end the host's MCP
//! session. It connects again as soon as there is a new token (a `--token-file` is read
//! again for every attempt), at once and then at each host request that needs the robot;
//! meanwhile those requests are answered with why not (`-32603`, `data.reason:
//! "unauthorized"`), and the rest (initialize, ping, prompts) are served as ever. A token
//! that was refused or ended is not presented again.

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::ends::{answer_with, initialize_robot, next_object};
use super::robot::Robot;
use super::session::Session;
use crate::config::{Config, Exit};
use crate::intake::Intake;
use crate::jsonrpc;
use crate::parent::{emit, ready_params, READY};
use crate::ws::{self, Link, WsError};

/// The close code of a connection whose token ended (the server's `token revoked`, also
/// sent at expiry).
pub const TOKEN_ENDED: u16 = 4003;

pub(super) fn token_ended(code: Option<u16>) -> bool {
    code == Some(TOKEN_ENDED)
}

/// The bridge between two connections.
pub(super) struct Offline<'a> {
    config: &'a Config,
    elicits: bool,
    /// The token that ended or was refused: not tried again.
    spent: Option<String>,
    /// Why the robot cannot be reached now (`data.reason`, message).
    reason: String,
    why: String,
}

impl<'a> Offline<'a> {
    pub(super) fn new(
        config: &'a Config,
        elicits: bool,
        spent: Option<String>,
        closed: String,
    ) -> Self {
        Offline {
            config,
            elicits,
            spent,
            reason: "unauthorized".into(),
            why: format!("the ARP connection ended ({closed})"),
        }
    }

    /// Serves the host until a connection with a new token is up (then returned), or the
    /// host goes (how the bridge ends).
    pub(super) async fn serve(
        mut self,
        session: &mut Session,
        intake: &mut Intake,
        out: &mpsc::Sender<String>,
    ) -> Result<Link, Exit> {
        if let Some(link) = self.try_connect(session, out).await {
            return Ok(link);
        }
        loop {
            let object = next_object(intake, out).await?;
            if !needs_robot(&object) {
                session.client_object(object).await;
                continue;
            }
            if let Some(link) = self.try_connect(session, out).await {
                session.client_object(object).await;
                return Ok(link);
            }
            answer_with(&object, out, &self.reason, &self.why).await;
        }
    }

    /// One attempt with the token as of now: a connection, `arp.initialize`d, that the
    /// session now uses; else `None` and why kept.
    async fn try_connect(
        &mut self,
        session: &mut Session,
        out: &mpsc::Sender<String>,
    ) -> Option<Link> {
        let token = match self.config.target.token.current() {
            Ok(token) => token,
            Err(e) => return self.failed("unauthorized", e.to_string()),
        };
        if token == self.spent {
            return self.failed("unauthorized", self.no_new_token());
        }
        let mut link = match ws::connect(&self.config.target).await {
            Ok(link) => link,
            Err(e) => {
                if matches!(e, WsError::Unauthorized(_)) {
                    self.spent = token;
                }
                return self.failed(e.kind(), e.to_string());
            }
        };
        let robot = Robot::new(link.to_robot.clone());
        let init = initialize_robot(self.config, &robot, &mut link, out, self.elicits).await;
        if let Err((reason, why)) = init {
            link.close().await;
            return self.failed(&reason, why);
        }
        eprintln!("arp-bridge: connected again, with a new token");
        let params = ready_params(self.config, json!({ "reconnected": true }));
        emit(out, jsonrpc::notification(READY, params)).await;
        session.reconnected(robot);
        Some(link)
    }

    fn failed(&mut self, reason: &str, why: String) -> Option<Link> {
        reason.clone_into(&mut self.reason);
        self.why = why;
        None
    }

    fn no_new_token(&self) -> String {
        let ended = "the token was revoked or has expired";
        match self.config.target.token.file() {
            Some(path) => format!(
                "{ended}, and {} holds no new one: write a new token there (it is read again \
                 at the next call)",
                path.display()
            ),
            None => format!(
                "{ended}: start arp-bridge with a new one (with --token-file it takes a new \
                 token without a restart)"
            ),
        }
    }
}

/// The host's requests that wait on the robot.
fn needs_robot(object: &Map<String, Value>) -> bool {
    object.contains_key("id")
        && matches!(
            object.get("method").and_then(Value::as_str),
            Some(
                "tools/list"
                    | "tools/call"
                    | "resources/list"
                    | "resources/read"
                    | "resources/subscribe"
            )
        )
}
