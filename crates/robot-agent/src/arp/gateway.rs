//! The third ARP transport: sessions of the server's gateway
//! (`/v1/robots/{id}/arp`), whose frames travel on the robot's signalling
//! socket as `arp.frame` envelopes (docs/protocol.md, "ARP sessions").
//!
//! Each `payload.connectionId` is one [`ArpServer::connect`] connection,
//! opened by its first frame. Who calls is the server's `meta.session` of
//! that first frame (a missing or unknown role is a viewer), never anything
//! in the frame; a later frame naming another role is refused
//! (`role_changed`). The connection ends when the server says
//! `signalling.disconnected` for it, when the signalling socket is lost
//! ([`Gateway::close_all`]) or, on the robot's side, when its handler
//! ends; in that last case the robot says `signalling.disconnected`
//! (`closed`). Ending it is the same as a local ARP socket closing: its
//! calls are cancelled, its control released and the robot stopped if it
//! was following it.
//!
//! The [`Gateway`] is owned by the peer manager, which receives everything
//! from the signalling client; every queue is bounded, and nothing here
//! waits on a slow connection (a full queue refuses the frame).
//!
//! A program that asked for signed frames (`?signed=<nonce>` at the gateway, passed here
//! as `meta.signatureNonce`) gets every frame of its session signed with the robot's key
//! when `sign_replies` is on ([`crate::reply_signing::ArpFrameSigner`]), refusals
//! included; the nonce is the one its session opened with.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{json, Value};
use signalling_protocol::arp::{
    method, reason, ArpCode, ArpFramePayload, ConfirmationPolicy, CONFIRMATION_POLICY_META_KEY,
};
use signalling_protocol::{
    DisconnectReason, DisconnectedPayload, Envelope, SessionMeta, Signalling, PROTOCOL_VERSION,
};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};

use super::{ArpServer, Peer, FRAME_CHANNEL};
use crate::messages;
use crate::reply_signing::{ArpFrameSigner, SIGNATURE_META_KEY};
use crate::safety::Role;

/// Most gateway ARP sessions served at once; the first frame of one more is
/// refused (`too_many_sessions`).
pub const MAX_CONNECTIONS: usize = 16;

/// Largest message the robot sends the server: the server's frame cap
/// (`--max-frame-bytes`, 64 KiB by default). A bigger one would close the
/// robot's signalling socket, so such an answer becomes an error.
pub const MAX_ENVELOPE_BYTES: usize = 64 * 1024;

/// Ends reported by the connections' pumps (one each at most).
const ENDED_CAPACITY: usize = MAX_CONNECTIONS * 2;

/// One gateway ARP session.
struct Connection {
    /// Tells this connection from an earlier one of the same id, so a late
    /// end report of the earlier one is ignored.
    generation: u64,
    role: Role,
    /// Signs what the robot answers, for a program that asked (`?signed=`).
    signer: Option<ArpFrameSigner>,
    frames: mpsc::Sender<String>,
    /// Closed (false) the moment the connection leaves the table: its pump
    /// sends nothing after, not even what its handler says as it ends
    /// (a call's `cancelled` answer), though an abort lands later.
    open: Gate,
    handler: AbortHandle,
    pump: JoinHandle<()>,
}

impl Drop for Connection {
    /// However the connection leaves the table, nothing more is sent for
    /// it, and its handler stops (and cleans up: calls cancelled, control
    /// released, the robot stopped if it followed it).
    fn drop(&mut self) {
        *lock(&self.open) = false;
        self.handler.abort();
        self.pump.abort();
    }
}

/// Whether a connection's frames may still go to the server; checked and
/// used under its lock, so a close is never overtaken.
type Gate = Arc<Mutex<bool>>;

fn lock(gate: &Gate) -> std::sync::MutexGuard<'_, bool> {
    // A bool cannot be left half-written.
    gate.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The gateway's ARP sessions, by `connectionId`.
pub struct Gateway {
    server: ArpServer,
    signalling: mpsc::Sender<Envelope>,
    connections: HashMap<String, Connection>,
    next: u64,
    ended_tx: mpsc::Sender<(String, u64)>,
    ended_rx: mpsc::Receiver<(String, u64)>,
}

impl Gateway {
    /// Serves gateway sessions with `server`; frames and ends go to the
    /// server through `signalling` (the signalling client's queue).
    pub fn new(server: ArpServer, signalling: mpsc::Sender<Envelope>) -> Gateway {
        let (ended_tx, ended_rx) = mpsc::channel(ENDED_CAPACITY);
        Gateway {
            server,
            signalling,
            connections: HashMap::new(),
            next: 1,
            ended_tx,
            ended_rx,
        }
    }

    /// Number of live gateway sessions.
    pub fn len(&self) -> usize {
        self.connections.len()
    }

    pub fn is_empty(&self) -> bool {
        self.connections.is_empty()
    }

    /// Whether `connection` is a live gateway session.
    pub fn contains(&self, connection: &str) -> bool {
        self.connections.contains_key(connection)
    }

    /// One `arp.frame` from the server.
    pub fn frame(
        &mut self,
        connection: String,
        frame: Value,
        session: Option<SessionMeta>,
        signature_nonce: Option<String>,
    ) {
        if !frame.is_object() {
            tracing::warn!(%connection, "arp.frame whose frame is not a JSON object; ignored");
            return;
        }
        // An e-stop takes effect now, outside the session's queue: the session may end
        // (the server's `disconnected` right behind it) before its handler reads it, and a
        // stop must never be lost that way. The session still answers a request for it.
        if is_emergency_stop(&frame) {
            self.stop_now(&connection, &frame, session.as_ref());
            if frame.get("id").is_none() {
                return;
            }
        }
        // Least privilege unless the server vouched for more.
        let role = session.as_ref().map_or(Role::Viewer, |s| s.role);
        if let Some(live) = self.connections.get(&connection) {
            let signer = live.signer.clone();
            if role != live.role && !is_emergency_stop(&frame) {
                tracing::warn!(
                    %connection,
                    opened_as = live.role.as_str(),
                    now = role.as_str(),
                    "gateway ARP frame with another role than its session's; refused"
                );
                let message = "the session's role may not change";
                let why = reason::ROLE_CHANGED;
                self.refuse(&connection, &frame, why, message, signer.as_ref());
                return;
            }
            match live.frames.try_send(frame.to_string()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(%connection, "gateway ARP session floods; frame refused");
                    let error = json!({
                        "code": ArpCode::SafetyViolation.code(),
                        "message": "too many frames waiting; slow down",
                        "data": { "reason": reason::RATE_LIMITED },
                    });
                    self.answer_error(&connection, &frame, error, signer.as_ref());
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    // Its handler ended; the end is being reported.
                    tracing::debug!(%connection, "frame for an ending gateway ARP session dropped");
                }
            }
            return;
        }
        let signer = self.signer(signature_nonce.as_deref());
        if self.connections.len() >= MAX_CONNECTIONS {
            tracing::warn!(%connection, max = MAX_CONNECTIONS, "too many gateway ARP sessions; refused");
            let message = "the robot serves no more ARP sessions now";
            let why = reason::TOO_MANY_SESSIONS;
            self.refuse(&connection, &frame, why, message, signer.as_ref());
            self.send_disconnected(
                &connection,
                DisconnectReason::Failed,
                Some(reason::TOO_MANY_SESSIONS),
            );
            return;
        }
        let subject = session.map(|s| s.subject);
        self.open(connection, frame, role, subject, signer);
    }

    /// The signer of a session whose program asked for signed frames with `nonce`, if the
    /// robot signs (`sign_replies`); without it, frames go unsigned and the program that
    /// asked refuses them.
    fn signer(&self, nonce: Option<&str>) -> Option<ArpFrameSigner> {
        let signer = self.server.shared().reply_signer.as_ref();
        match (nonce, signer) {
            (Some(nonce), Some(signer)) => Some(signer.for_arp(nonce)),
            (Some(_), None) => {
                tracing::warn!("a program asked for signed ARP frames, but sign_replies is off");
                None
            }
            (None, _) => None,
        }
    }

    fn open(
        &mut self,
        connection: String,
        frame: Value,
        role: Role,
        subject: Option<String>,
        signer: Option<ArpFrameSigner>,
    ) {
        let generation = self.next;
        self.next += 1;
        let peer = Peer {
            key: format!("gateway/{connection}/{generation}"),
            // Not a WebRTC session: it shares control with none.
            session: None,
            role,
            subject: subject.unwrap_or_else(|| format!("gateway:{connection}")),
        };
        let (frames, inbound) = mpsc::channel(FRAME_CHANNEL);
        let (outbound, out_rx) = mpsc::channel(FRAME_CHANNEL);
        let handler = self.server.connect(peer, inbound, outbound);
        let abort = handler.abort_handle();
        let open: Gate = Arc::new(Mutex::new(true));
        let link = Link {
            signalling: self.signalling.clone(),
            open: open.clone(),
            connection: connection.clone(),
            signer: signer.clone(),
            confirmation_policy: self.server.inner.options.confirmation_policy,
        };
        let pump = tokio::spawn(pump(
            handler,
            out_rx,
            link,
            generation,
            self.ended_tx.clone(),
        ));
        // A fresh queue has room.
        let _ = frames.try_send(frame.to_string());
        tracing::info!(%connection, role = role.as_str(), "gateway ARP session opened");
        self.connections.insert(
            connection,
            Connection {
                generation,
                role,
                signer,
                frames,
                open,
                handler: abort,
                pump,
            },
        );
    }

    /// Latches the e-stop an `arp.emergencyStop` asks for, at once.
    fn stop_now(&self, connection: &str, frame: &Value, session: Option<&SessionMeta>) {
        let reason: String = frame
            .pointer("/params/reason")
            .and_then(Value::as_str)
            .filter(|r| !r.trim().is_empty())
            .unwrap_or("arp.emergencyStop")
            .chars()
            .take(256)
            .collect();
        let subject = session.map_or("unknown", |s| s.subject.as_str());
        tracing::error!(%connection, %subject, %reason, "ARP emergency stop through the gateway");
        let controller = self.server.shared().controller.clone();
        tokio::spawn(async move { controller.emergency_stop(&reason).await });
    }

    /// The server ended `connection` (`signalling.disconnected`); whether
    /// it was a gateway session.
    pub fn disconnected(&mut self, connection: &str) -> bool {
        let known = self.connections.remove(connection).is_some();
        if known {
            tracing::info!(%connection, "gateway ARP session ended by the server");
        }
        known
    }

    /// The signalling socket is gone: every gateway session ends (nothing
    /// is reported, there is no one to tell).
    pub fn close_all(&mut self) {
        if !self.connections.is_empty() {
            tracing::info!(
                sessions = self.connections.len(),
                "signalling lost: gateway ARP sessions ended"
            );
        }
        self.connections.clear();
    }

    /// The next connection that ended on the robot's side; pass it to
    /// [`Gateway::ended`]. Never ready while none did.
    pub async fn next_ended(&mut self) -> (String, u64) {
        match self.ended_rx.recv().await {
            Some(ended) => ended,
            // Cannot happen: the gateway holds a sender.
            None => std::future::pending().await,
        }
    }

    /// A connection ended on the robot's side: the server is told
    /// (`disconnected`, `closed`), unless it ended it first.
    pub fn ended(&mut self, (connection, generation): (String, u64)) {
        let current = self
            .connections
            .get(&connection)
            .is_some_and(|c| c.generation == generation);
        if !current {
            return;
        }
        self.connections.remove(&connection);
        tracing::warn!(%connection, "gateway ARP session ended on the robot's side");
        self.send_disconnected(&connection, DisconnectReason::Closed, None);
    }

    /// Answers a refused request with `-32603` and `data.reason`; a refused
    /// notification or answer is only logged (JSON-RPC answers neither).
    fn refuse(
        &self,
        connection: &str,
        frame: &Value,
        why: &str,
        message: &str,
        signer: Option<&ArpFrameSigner>,
    ) {
        let error = json!({
            "code": ArpCode::InternalError.code(),
            "message": message,
            "data": { "reason": why },
        });
        self.answer_error(connection, frame, error, signer);
    }

    fn answer_error(
        &self,
        connection: &str,
        frame: &Value,
        error: Value,
        signer: Option<&ArpFrameSigner>,
    ) {
        if frame.get("method").is_none() {
            return;
        }
        let Some(id) = frame.get("id").filter(|id| valid_id(id)) else {
            return;
        };
        let answer = json!({ "jsonrpc": "2.0", "id": id, "error": error });
        self.send(frame_envelope(connection, answer, signer));
    }

    fn send_disconnected(&self, connection: &str, reason: DisconnectReason, why: Option<&str>) {
        let envelope = Envelope::from_body(
            Signalling::Disconnected(DisconnectedPayload {
                connection_id: connection.to_owned(),
                reason,
                ice_connection_state: None,
                details: why.map(|why| messages::details(why, &[])),
            }),
            PROTOCOL_VERSION,
        );
        self.send(envelope);
    }

    /// The manager's own messages never wait (as for teleop sessions).
    fn send(&self, envelope: Envelope) {
        if self.signalling.try_send(envelope).is_err() {
            tracing::warn!("signalling queue full or closed; gateway message dropped");
        }
    }
}

/// A JSON-RPC id ARP accepts: a string or an integer.
fn valid_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

/// An e-stop is taken from anyone, whatever its frame's role says.
fn is_emergency_stop(frame: &Value) -> bool {
    frame.get("method").and_then(Value::as_str) == Some(method::EMERGENCY_STOP)
}

/// Carries one connection's frames to the server, in order, waiting for
/// room in the signalling queue (answers are never dropped; the
/// connection's own queue is what lags). When the handler ends, what it
/// queued still goes out, then the end is reported.
async fn pump(
    mut handler: JoinHandle<()>,
    mut out: mpsc::Receiver<String>,
    link: Link,
    generation: u64,
    ended: mpsc::Sender<(String, u64)>,
) {
    loop {
        tokio::select! {
            frame = out.recv() => {
                let Some(text) = frame else { break };
                if !link.forward(&text).await {
                    break;
                }
            }
            result = &mut handler => {
                if let Some(e) = result.as_ref().err().filter(|e| !e.is_cancelled()) {
                    tracing::error!(connection = %link.connection, error = %e, "gateway ARP handler failed");
                }
                while let Ok(text) = out.try_recv() {
                    if !link.forward(&text).await {
                        break;
                    }
                }
                break;
            }
        }
    }
    let _ = ended.send((link.connection, generation)).await;
}

/// A connection's way to the server.
struct Link {
    signalling: mpsc::Sender<Envelope>,
    open: Gate,
    connection: String,
    signer: Option<ArpFrameSigner>,
    /// Said with every `arp.requestConfirmation`: who the server may let answer it.
    confirmation_policy: ConfirmationPolicy,
}

impl Link {
    /// One frame the robot sends, as an `arp.frame`; `false` once the
    /// connection is closed or the signalling client gone.
    async fn forward(&self, text: &str) -> bool {
        let connection = &self.connection;
        let frame: Value = match serde_json::from_str(text) {
            Ok(frame) => frame,
            Err(e) => {
                tracing::error!(%connection, error = %e, "the ARP handler wrote a frame that is not JSON");
                return true;
            }
        };
        let asks =
            frame.get("method").and_then(Value::as_str) == Some(method::REQUEST_CONFIRMATION);
        let Some(mut envelope) = fitted(connection, frame, text.len(), self.signer.as_ref()) else {
            return true;
        };
        if asks {
            let meta = envelope.meta.get_or_insert_with(Default::default);
            let policy = Value::String(self.confirmation_policy.as_str().into());
            meta.insert(CONFIRMATION_POLICY_META_KEY.into(), policy);
        }
        // Room first (waiting), then the gate and the send at once.
        let Ok(permit) = self.signalling.reserve().await else {
            return false;
        };
        let open = lock(&self.open);
        if *open {
            permit.send(envelope);
        }
        *open
    }
}

/// The envelope of `frame`, if it fits the server's frame cap; an answer
/// that does not becomes an error answer, anything else is dropped.
fn fitted(
    connection: &str,
    frame: Value,
    frame_len: usize,
    signer: Option<&ArpFrameSigner>,
) -> Option<Envelope> {
    let envelope = frame_envelope(connection, frame, signer);
    // Measured exactly only near the limit: the envelope adds a few hundred
    // bytes to the frame and its connection id (escaped at most 6 times).
    let roomy = frame_len + 6 * connection.len() + 512 <= MAX_ENVELOPE_BYTES;
    if roomy || envelope.to_json().len() <= MAX_ENVELOPE_BYTES {
        return Some(envelope);
    }
    let frame = envelope.payload.as_ref().and_then(|p| p.get("frame"));
    let id = frame
        .filter(|f| f.get("method").is_none())
        .and_then(|f| f.get("id"))
        .filter(|id| valid_id(id));
    match id {
        Some(id) => {
            tracing::warn!(%connection, max = MAX_ENVELOPE_BYTES, "ARP answer too large for the gateway; an error is sent instead");
            let error = json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {
                    "code": ArpCode::InternalError.code(),
                    "message": format!("the answer is larger than the gateway's {MAX_ENVELOPE_BYTES} bytes"),
                    "data": { "reason": "frame_too_large" },
                },
            });
            Some(frame_envelope(connection, error, signer))
        }
        None => {
            tracing::warn!(%connection, max = MAX_ENVELOPE_BYTES, "ARP message too large for the gateway; dropped");
            None
        }
    }
}

/// The `arp.frame` of one frame the robot sends, signed in `meta.signature` with `signer`.
fn frame_envelope(connection: &str, frame: Value, signer: Option<&ArpFrameSigner>) -> Envelope {
    let signature = signer.and_then(|signer| match signer.sign(&frame) {
        Ok(jws) => Some(jws),
        Err(e) => {
            // Sent unsigned: the program that asked for signatures refuses it.
            tracing::error!(%connection, error = %e, "cannot sign an ARP frame");
            None
        }
    });
    let mut envelope = ArpFramePayload::new(connection, frame).to_envelope(None);
    if let Some(signature) = signature {
        let meta = envelope.meta.get_or_insert_with(Default::default);
        meta.insert(SIGNATURE_META_KEY.into(), Value::String(signature));
    }
    envelope
}

#[cfg(test)]
#[path = "gateway_tests.rs"]
mod tests;
