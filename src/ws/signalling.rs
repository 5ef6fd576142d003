//! `/ws` signalling (spec and legacy dialects) as a handler on the connection runtime: the
//! socket's rate limit and strikes, the login and token deadlines, the credentials
//! refresh, and what each message means ([`Protocol`]).

use std::time::{Duration, Instant};

use axum::extract::ws::Utf8Bytes;

use super::connection::{kick_close, Handler, Inbound, Outbox};
use super::error::WsError;
use super::protocol::{Peer, Protocol};
use crate::auth::ClientIdentity;
use crate::messages;
use crate::rate_limit::{RateLimiter, Strikes};
use crate::relay::{ConnId, Kick};
use crate::state::SharedState;

/// Window over which strikes (errors earned, messages over the rate limit) are counted.
const STRIKE_WINDOW: Duration = Duration::from_secs(10);

/// One `/ws` socket's protocol state and the limits it is held to.
pub struct Signalling {
    protocol: Protocol,
    limiter: RateLimiter,
    strikes: Strikes,
    /// The role the connections gauge counts this socket under.
    role: &'static str,
    /// When an unverified socket must have logged in.
    login_deadline: Instant,
    /// Closing for too many strikes (logged with who the peer is once the loop ends).
    cut_off: bool,
    /// Closing for cause (a credential withdrawn or expired, an error that ends the
    /// connection, a flood): its sessions end at once rather than wait to be resumed.
    for_cause: bool,
}

impl Signalling {
    pub fn new(state: &SharedState, conn: &ConnId, client: Option<ClientIdentity>) -> Signalling {
        if let Some(identity) = &client {
            tracing::debug!(subject = %identity.subject, "client connected");
        }
        let limits = state.config.socket_limits();
        let now = Instant::now();
        let protocol = Protocol::new(state.clone(), conn.clone(), client);
        let role = protocol.role_label();
        state.metrics.connections.with_label_values(&[role]).inc();
        Signalling {
            protocol,
            limiter: RateLimiter::new(limits.rate, limits.burst, now),
            strikes: Strikes::default(),
            role,
            login_deadline: now + limits.login_timeout,
            cut_off: false,
            for_cause: false,
        }
    }

    /// The per-frame checks: strikes from other nodes, the rate limit, the frame kind and
    /// size. The text of a frame within every limit, for the protocol.
    fn admit(&mut self, frame: Inbound, now: Instant, out: &mut Outbox<'_>) -> Option<Utf8Bytes> {
        let limits = out.limits();
        if matches!(frame, Inbound::TooLarge) {
            self.too_large(out);
            return None;
        }
        // Refusals made on other nodes count as strikes too, as they would here.
        for _ in 0..out.kick.take_remote_strikes().min(limits.max_strikes + 1) {
            self.count_strike(now, out);
            if !out.is_open() {
                return None;
            }
        }
        // Every frame counts against the rate limit: binary and control frames too.
        if !self.limiter.allow(now) {
            self.strike(&WsError::RateLimited, now, out);
            return None;
        }
        match frame {
            Inbound::Text(text) if text.len() > limits.max_frame_bytes => self.too_large(out),
            Inbound::Text(text) => return Some(text),
            Inbound::Binary(len) if len > limits.max_frame_bytes => self.too_large(out),
            Inbound::Binary(_) => self.strike(&WsError::Binary, now, out),
            Inbound::Control | Inbound::TooLarge => {}
        }
        None
    }

    /// Sends what the protocol made of a frame: its replies, then its error if any, which
    /// closes the socket or counts as a strike.
    fn handled(
        &mut self,
        result: Result<(), (WsError, Option<String>)>,
        now: Instant,
        out: &mut Outbox<'_>,
    ) {
        for reply in self.protocol.replies.drain(..) {
            out.reply(reply);
        }
        let Err((error, id)) = result else { return };
        if matches!(error.code(), signalling_protocol::ErrorCode::InternalError) {
            tracing::error!(error = %error, "message failed");
        }
        self.error(&error, id.as_deref(), out);
        match error.close() {
            Some((code, reason)) => {
                self.for_cause = true;
                out.close_now((code, reason.into()));
            }
            // A robot told that a client does not keep up is not at fault: a stalled
            // viewer must not get the robot cut off for strikes.
            None if matches!(error, WsError::Throttled) && self.protocol.is_robot() => {}
            None => self.count_strike(now, out),
        }
    }

    fn error(&self, error: &WsError, correlation: Option<&str>, out: &mut Outbox<'_>) {
        let code = error.code();
        out.state
            .metrics
            .errors
            .with_label_values(&[code.as_str()])
            .inc();
        let text = messages::error(code, &error.to_string(), error.details(), correlation);
        out.reply(text);
    }

    /// An error that does not close the socket by itself, counted as a strike.
    fn strike(&mut self, error: &WsError, now: Instant, out: &mut Outbox<'_>) {
        self.error(error, None, out);
        self.count_strike(now, out);
    }

    /// Too many strikes within the window close the socket, whatever came in between.
    fn count_strike(&mut self, now: Instant, out: &mut Outbox<'_>) {
        if self
            .strikes
            .strike(now, out.limits().max_strikes, STRIKE_WINDOW)
        {
            let error = WsError::Flooding;
            self.cut_off = true;
            self.for_cause = true;
            out.state.metrics.peers_cut_off.inc();
            self.error(&error, None, out);
            if let Some((code, reason)) = error.close() {
                out.close_now((code, reason.into()));
            }
        }
    }

    fn too_large(&mut self, out: &mut Outbox<'_>) {
        let error = WsError::TooLarge {
            limit: out.limits().max_frame_bytes,
        };
        self.error(&error, None, out);
        self.for_cause = true;
        let (code, reason) = error.close().unwrap_or((1009, "frame too large"));
        out.close_now((code, reason.into()));
    }

    /// Moves the socket's count in the connections gauge to the role it has now.
    fn recount_role(&mut self, state: &SharedState) {
        let now = self.protocol.role_label();
        if now != self.role {
            state
                .metrics
                .connections
                .with_label_values(&[self.role])
                .dec();
            state.metrics.connections.with_label_values(&[now]).inc();
            self.role = now;
        }
    }
}

impl Handler for Signalling {
    type Event = ();
    const READS_INBOX: bool = false;

    fn open(&mut self, out: &mut Outbox<'_>) {
        for welcome in self.protocol.welcome_at_open() {
            out.reply(welcome);
        }
    }

    async fn frame(&mut self, frame: Inbound, now: Instant, out: &mut Outbox<'_>) {
        let Some(text) = self.admit(frame, now, out) else {
            return;
        };
        let result = self.protocol.handle(&text, now).await;
        self.handled(result, now, out);
        self.recount_role(out.state);
    }

    fn event(&mut self) -> impl std::future::Future<Output = ()> + Send {
        std::future::pending()
    }

    async fn on_event(&mut self, _event: (), _out: &mut Outbox<'_>) {}

    fn wake_at(&self) -> Option<Instant> {
        let deadline = self
            .protocol
            .deadline(self.login_deadline)
            .map(|(at, _)| at);
        [deadline, self.protocol.credentials_refresh_at()]
            .into_iter()
            .flatten()
            .min()
    }

    fn wake(&mut self, now: Instant, out: &mut Outbox<'_>) {
        if let Some((at, error)) = self.protocol.deadline(self.login_deadline) {
            if at <= now {
                self.error(&error, None, out);
                self.for_cause = true;
                let (code, reason) = error.close().unwrap_or((1008, "deadline"));
                out.close_now((code, reason.into()));
                return;
            }
        }
        if self
            .protocol
            .credentials_refresh_at()
            .is_some_and(|at| at <= now)
        {
            self.protocol.refresh_credentials();
            for reply in self.protocol.replies.drain(..) {
                out.reply(reply);
            }
        }
    }

    fn kicked(&mut self, kick: Kick, out: &mut Outbox<'_>) {
        if kick == Kick::Revoked {
            let error = WsError::Identity(crate::identity::IdentityError::Revoked);
            self.error(&error, None, out);
        }
        self.for_cause = matches!(kick, Kick::Revoked | Kick::TokenRevoked);
        out.close_now(kick_close(kick));
    }

    fn legacy(&self) -> bool {
        self.protocol.legacy
    }

    async fn leave(&mut self, out: &mut Outbox<'_>) {
        let state = out.state;
        if self.cut_off {
            tracing::warn!(
                peer = %self.protocol.peer_label(),
                strikes = out.limits().max_strikes,
                window_secs = STRIKE_WINDOW.as_secs(),
                "closing a peer that keeps earning errors or exceeding the rate limit"
            );
        }
        state
            .metrics
            .connections
            .with_label_values(&[self.role])
            .dec();
        state
            .sessions
            .detach(&self.protocol.conn, !self.for_cause)
            .await;
        match &self.protocol.peer {
            Peer::Robot { robot_id } => tracing::info!(robot = %robot_id, "robot disconnected"),
            Peer::Client(identity) => {
                tracing::debug!(subject = %identity.subject, "client disconnected")
            }
            Peer::Unverified { .. } => {}
        }
    }
}
