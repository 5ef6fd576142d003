//! The signalling protocol on one socket: what each message means for the sender's role.

use std::time::Instant;

use axum::extract::ws::Utf8Bytes;
use signalling_protocol::{
    is_legacy_ready, ArpFrameView, Body, ConnectedPayload, DisconnectReason, DisconnectedPayload,
    Envelope, ProtocolError, Relayed, RelayedKind, Role, Signalling,
};

mod login;
mod relaying;

use super::error::WsError;
use super::legacy;
use crate::auth::ClientIdentity;
use crate::identity::{Challenge, IdentityError};
use crate::messages::{self, ARP_FRAME};
use crate::relay::ConnId;
use crate::state::SharedState;

/// How an `arp.frame` written type first begins.
const ARP_FRAME_START: &str = "{\"type\":\"arp.frame\"";

/// Longest text considered as a legacy `{"type":"ready"}` greeting.
const LEGACY_READY_MAX: usize = 256;

/// What a relayed session message means for the session.
enum Relay {
    Plain,
    /// Answers come from the robot end only.
    FromRobot,
    Connected,
    Ends(DisconnectReason),
}

/// A session message on its way to the other end, and how it is written for it.
enum Forward<'a> {
    /// The frame as received, vouched for by the one-pass view: passed on as is (to a
    /// client) or with the server's `meta` spliced in (to a robot).
    Received {
        text: &'a Utf8Bytes,
        view: &'a Relayed<'a>,
    },
    /// A message the full parser read (legacy frames, valid but unusual forms): written anew.
    Parsed(Envelope),
}

impl Forward<'_> {
    /// The sender asked to take the robot over (`meta.takeover: true`, an owner's offer:
    /// the offer's payload schema admits no field of ours).
    fn takeover(&self) -> bool {
        let meta = match self {
            Forward::Received { text, view } => view
                .meta(text.as_str())
                .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok()),
            Forward::Parsed(envelope) => envelope.meta.clone().map(serde_json::Value::Object),
        };
        meta.and_then(|m| m.get("takeover").and_then(serde_json::Value::as_bool)) == Some(true)
    }

    fn id(&self) -> &str {
        match self {
            Forward::Received { view, .. } => &view.id,
            Forward::Parsed(envelope) => &envelope.id,
        }
    }

    fn kind(&self) -> &str {
        match self {
            Forward::Received { view, .. } => view.kind.type_name(),
            Forward::Parsed(envelope) => &envelope.kind,
        }
    }

    /// For the robot: `meta.session` says who it talks to, whatever the sender put there,
    /// with the server's signed ticket when there is one (offers).
    /// What a robot's `disconnected` says of a session ticket (`details.reason`
    /// `bad_ticket` or `ticket_expired`), as the kind the refusal metric counts it under.
    /// Disconnects are once per session: reading the text again costs nothing that shows.
    fn ticket_refusal(&self) -> Option<&'static str> {
        let details = match self {
            Forward::Received { text, .. } => serde_json::from_str::<serde_json::Value>(text)
                .ok()?
                .pointer("/payload/details/reason")?
                .as_str()
                .map(str::to_owned)?,
            Forward::Parsed(envelope) => envelope
                .payload
                .as_ref()?
                .pointer("/details/reason")?
                .as_str()?
                .to_owned(),
        };
        match details.as_str() {
            signalling_protocol::arp::reason::BAD_TICKET => Some("offer"),
            signalling_protocol::ticket::EXPIRED_REASON => Some("expired"),
            _ => None,
        }
    }

    fn into_robot(self, subject: &str, role: Role, ticket: Option<&str>) -> Utf8Bytes {
        match self {
            Forward::Received { text, view } => {
                view.with_session(text, subject, role, ticket).into()
            }
            Forward::Parsed(mut envelope) => {
                envelope.meta = Some(messages::session_meta(subject, role, ticket));
                envelope.to_json().into()
            }
        }
    }

    /// For the client: without any `meta` of the robot's.
    fn into_client(self) -> Utf8Bytes {
        match self {
            Forward::Received { text, view } if !view.has_meta() => text.clone(),
            Forward::Received { text, .. } => match Envelope::parse(text) {
                Ok(envelope) => Forward::Parsed(envelope).into_client(),
                // Unreachable: the view accepted it, and the parser accepts all it does.
                Err(_) => text.clone(),
            },
            Forward::Parsed(mut envelope) => {
                envelope.meta = None;
                envelope.to_json().into()
            }
        }
    }
}

/// What the socket is, as far as the server knows.
pub enum Peer {
    /// No token: may only become a robot.
    Unverified {
        /// Boxed: it lives only during the login, and inline it would make every socket
        /// task a few hundred bytes bigger for good.
        challenge: Option<Box<Challenge>>,
    },
    Robot {
        robot_id: String,
    },
    Client(ClientIdentity),
}

pub struct Protocol {
    pub state: SharedState,
    pub conn: ConnId,
    pub peer: Peer,
    /// When a client's token expires, fixed at login.
    token_deadline: Option<Instant>,
    /// Replies for this socket itself, written by the socket loop in order.
    pub replies: Vec<String>,
    /// A token-less socket asked for welcomes (`ready`, or `register` with
    /// `metadata.wantsWelcome`): it gets a fresh one, with TURN credentials, once verified.
    wants_welcome: bool,
    /// What the robot declared when it registered (ARP, ticket renewals).
    declared: crate::relay::RobotDeclared,
    /// The client speaks Modulr's older flat dialect (see `legacy`): its replies are
    /// rendered flat by the writer.
    pub legacy: bool,
    /// When the socket last got TURN credentials, which expire: it gets fresh ones in time.
    credentials_issued: Option<Instant>,
}

/// Key in `signalling.register`'s `metadata` by which a robot asks for welcomes.
pub const WANTS_WELCOME: &str = "wantsWelcome";

impl Protocol {
    pub fn new(state: SharedState, conn: ConnId, client: Option<ClientIdentity>) -> Protocol {
        let token_deadline = client.as_ref().and_then(|c| c.expires_at).map(|at| {
            let left = (at - crate::store::now_ms()).max(0) as u64;
            Instant::now() + std::time::Duration::from_millis(left)
        });
        let peer = match client {
            Some(identity) => Peer::Client(identity),
            None => Peer::Unverified { challenge: None },
        };
        Protocol {
            state,
            conn,
            peer,
            token_deadline,
            replies: Vec::new(),
            wants_welcome: false,
            declared: crate::relay::RobotDeclared::default(),
            legacy: false,
            credentials_issued: None,
        }
    }

    pub fn is_robot(&self) -> bool {
        matches!(self.peer, Peer::Robot { .. })
    }

    pub fn role_label(&self) -> &'static str {
        match self.peer {
            Peer::Unverified { .. } => "pending",
            Peer::Robot { .. } => "robot",
            Peer::Client(_) => "client",
        }
    }

    /// Who the peer is, for log lines that must name it.
    pub fn peer_label(&self) -> String {
        match &self.peer {
            Peer::Unverified { .. } => "unverified".to_string(),
            Peer::Robot { robot_id } => format!("robot {robot_id}"),
            Peer::Client(identity) => format!("client {}", identity.subject),
        }
    }

    /// The welcome sent as soon as the socket opens: to clients only. A socket without a
    /// token is a robot (or a legacy browser) and gets one when it asks: `ready`, or
    /// `register` with `metadata.wantsWelcome` (the Modulr agent logs an error for every
    /// welcome it did not ask for).
    pub fn welcome_at_open(&mut self) -> Vec<String> {
        match self.peer {
            Peer::Client(_) if self.state.config.legacy_clients => {
                vec![self.welcome(), legacy::welcome(&self.conn)]
            }
            Peer::Client(_) => vec![self.welcome()],
            _ => Vec::new(),
        }
    }

    pub fn welcome(&mut self) -> String {
        let ice = &self.state.ice;
        let servers = match &self.peer {
            Peer::Unverified { .. } => ice.public_servers(),
            Peer::Robot { robot_id } => {
                ice.servers_for(&format!("robot:{robot_id}"), crate::clock::now_secs())
            }
            Peer::Client(identity) => ice.servers_for(&identity.subject, crate::clock::now_secs()),
        };
        if ice.issues_credentials() && !matches!(self.peer, Peer::Unverified { .. }) {
            self.credentials_issued = Some(Instant::now());
        }
        messages::welcome(&self.conn, servers)
    }

    /// When this socket's TURN credentials are due for renewal, if it holds any.
    pub fn credentials_refresh_at(&self) -> Option<Instant> {
        self.credentials_issued
            .map(|issued| issued + self.state.ice.refresh_after())
    }

    /// A fresh welcome, with new TURN credentials, for a socket whose old ones are
    /// about to lapse (the same welcome it got before; its connectionId is unchanged).
    pub fn refresh_credentials(&mut self) {
        let welcome = self.welcome();
        self.replies.push(welcome);
    }

    /// When the socket must be closed unless something happens first.
    pub fn deadline(&self, login_deadline: Instant) -> Option<(Instant, WsError)> {
        match &self.peer {
            Peer::Unverified { challenge: Some(c) } => Some((
                c.expires_at().min(login_deadline),
                if c.expires_at() <= login_deadline {
                    WsError::Identity(IdentityError::ChallengeExpired)
                } else {
                    WsError::LoginTimeout
                },
            )),
            Peer::Unverified { challenge: None } => Some((login_deadline, WsError::LoginTimeout)),
            Peer::Client(_) => self.token_deadline.map(|at| (at, WsError::TokenExpired)),
            Peer::Robot { .. } => None,
        }
    }

    /// Handles one text frame. `Err` carries the id of the offending message, if known.
    pub async fn handle(
        &mut self,
        frame: &Utf8Bytes,
        received: Instant,
    ) -> Result<(), (WsError, Option<String>)> {
        let text = frame.as_str();
        // A robot's ARP frame as robot-agent writes it (type first): read by its own view at
        // once, not by the session messages' first.
        if text.starts_with(ARP_FRAME_START) {
            if let Some(view) = ArpFrameView::parse(text) {
                return self
                    .arp_frame(frame.clone(), Some(view.session.as_ref()))
                    .map_err(|e| (e, Some(view.id.to_string())));
            }
        }
        // Session messages, nearly all the traffic, in one pass; anything the view does
        // not vouch for is read by the full parser below.
        if let Some(view) = Relayed::parse(text) {
            let plain = match view.kind {
                RelayedKind::Answer => Some(Relay::FromRobot),
                RelayedKind::IceCandidate => Some(Relay::Plain),
                _ => None,
            };
            // Answers and candidates are queued without awaiting anything. The rest write
            // records first: they wait on the heap, so no view is kept in every socket's
            // task while it is idle.
            return match plain {
                Some(kind) => {
                    let forward = Forward::Received {
                        text: frame,
                        view: &view,
                    };
                    self.relay_now(forward, &view.session, received, kind)
                        .map_err(|e| (e, Some(view.id.to_string())))
                }
                None => {
                    Box::pin(async move {
                        self.relay_received(frame, &view, received)
                            .await
                            .map_err(|e| (e, Some(view.id.to_string())))
                    })
                    .await
                }
            };
        }
        // A robot's ARP frame for a gateway session: passed on as received, read once here
        // for its session (the gateway reads the frame itself).
        if text.contains("\"arp.frame\"") {
            if let Some(view) = ArpFrameView::parse(text) {
                return self
                    .arp_frame(frame.clone(), Some(view.session.as_ref()))
                    .map_err(|e| (e, Some(view.id.to_string())));
            }
        }
        // Everything else (logins, pings, legacy frames, unusual forms) is rarer and waits
        // on more: its future lives on the heap while it runs, not in every socket's task.
        Box::pin(self.handle_parsed(text, received)).await
    }

    /// A frame the one-pass view did not take, read by the full parser.
    async fn handle_parsed(
        &mut self,
        text: &str,
        received: Instant,
    ) -> Result<(), (WsError, Option<String>)> {
        // The legacy greeting is tiny; checking size first keeps a second JSON parse off
        // the relay path.
        if text.len() <= LEGACY_READY_MAX && is_legacy_ready(text) {
            self.wants_welcome = true;
            let welcome = self.welcome();
            self.replies.push(welcome);
            return Ok(());
        }
        let envelope = match Envelope::parse(text) {
            Ok(envelope) => envelope,
            // Only frames that are not spec envelopes get here: the legacy check costs
            // the spec path nothing.
            Err(e) if matches!(self.peer, Peer::Client(_)) => match legacy_frame(text) {
                Some(value) => {
                    self.legacy = true;
                    let envelope = legacy::to_envelope(value, &self.conn, |id| {
                        self.state.sessions.names_another_session(id, &self.conn)
                    })
                    .map_err(|e| (e.into(), None))?;
                    let id = envelope.id.clone();
                    return self
                        .dispatch(envelope, received)
                        .await
                        .map_err(|e| (e, Some(id)));
                }
                None => return Err((e.into(), raw_id(text))),
            },
            // A peer's error is never answered, even a malformed one: that is how error
            // ping-pong starts.
            Err(e) if raw_type(text).as_deref() == Some("signalling.error") => {
                tracing::debug!(error = %e, "ignoring a malformed error report");
                return Ok(());
            }
            Err(e) => return Err((e.into(), raw_id(text))),
        };
        let id = envelope.id.clone();
        if envelope.kind == ARP_FRAME {
            let session = envelope
                .payload
                .as_ref()
                .and_then(|p| p.get("connectionId"))
                .and_then(serde_json::Value::as_str);
            return self
                .arp_frame(Utf8Bytes::from(text.to_string()), session)
                .map_err(|e| (e, Some(id)));
        }
        self.dispatch(envelope, received)
            .await
            .map_err(|e| (e, Some(id)))
    }

    async fn dispatch(&mut self, envelope: Envelope, received: Instant) -> Result<(), WsError> {
        let Body::Signalling(message) = envelope.body()? else {
            return Err(ProtocolError::UnsupportedType(format!(
                "{} travels on the WebRTC data channel, not the signalling socket",
                envelope.kind
            ))
            .into());
        };
        match message {
            Signalling::Ping => self.replies.push(messages::pong(&envelope.id)),
            Signalling::Capabilities(_) => self.replies.push(messages::capabilities(&envelope.id)),
            // Logins wait on the database and the signature pool: their futures are large,
            // so they live on the heap while they run instead of in every idle socket's task.
            Signalling::Register(payload) => Box::pin(self.register(payload)).await?,
            Signalling::PkiResponse(payload) => {
                Box::pin(self.pki_response(&envelope, payload)).await?
            }
            Signalling::Offer(payload) => {
                let (robot, session) = (payload.robot_id, payload.connection_id);
                Box::pin(self.offer(Forward::Parsed(envelope), &robot, &session, received)).await?
            }
            Signalling::Answer(payload) => {
                let session = payload.connection_id;
                self.relay(
                    Forward::Parsed(envelope),
                    &session,
                    received,
                    Relay::FromRobot,
                )
                .await?;
            }
            Signalling::IceCandidate(payload) => {
                let session = payload.connection_id;
                self.relay(Forward::Parsed(envelope), &session, received, Relay::Plain)
                    .await?;
            }
            Signalling::Connected(ConnectedPayload { connection_id, .. }) => {
                self.relay(
                    Forward::Parsed(envelope),
                    &connection_id,
                    received,
                    Relay::Connected,
                )
                .await?;
            }
            Signalling::Disconnected(DisconnectedPayload {
                connection_id,
                reason,
                ..
            }) => {
                self.relay(
                    Forward::Parsed(envelope),
                    &connection_id,
                    received,
                    Relay::Ends(reason),
                )
                .await?;
            }
            // Peers report their own errors; answering them could start an error ping-pong.
            Signalling::Error(error) => {
                tracing::debug!(code = error.code.as_str(), "peer reported an error")
            }
            Signalling::Pong => {}
            Signalling::Welcome(_) | Signalling::PkiChallenge(_) | Signalling::PkiVerified(_) => {
                return Err(ProtocolError::UnsupportedType(format!(
                    "{} is sent by the server only",
                    envelope.kind
                ))
                .into())
            }
        }
        Ok(())
    }
}

/// A frame in Modulr's flat dialect, parsed; None for anything else.
fn legacy_frame(text: &str) -> Option<serde_json::Value> {
    let value = serde_json::from_str::<serde_json::Value>(text).ok()?;
    legacy::is_flat(&value).then_some(value)
}

/// The `id` of a message that failed to parse, so the error can still be correlated.
fn raw_id(text: &str) -> Option<String> {
    raw_field(text, "id")
}

fn raw_type(text: &str) -> Option<String> {
    raw_field(text, "type")
}

fn raw_field(text: &str, field: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()?
        .get(field)?
        .as_str()
        .map(str::to_string)
}
