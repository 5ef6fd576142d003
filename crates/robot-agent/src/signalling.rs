//! The signalling client: connects to the server's WebSocket, registers,
//! proves the robot's identity (signs the PKI challenge), and then relays
//! session messages between the server and the peer manager.
//!
//! It registers as soon as the socket opens, asking for a welcome
//! (`register.metadata.wantsWelcome`): servers send one after
//! `pki_verified` to robots that ask, older ones at open; either way the
//! login does not wait for it, and every welcome's ICE servers (TURN
//! credentials) are taken whenever it arrives.
//!
//! It reconnects forever with exponential backoff and jitter, and registers
//! again after every reconnect. The peer manager is told when the robot goes
//! online (with the ICE servers to use) and when the connection is lost.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Map, Value};
use signalling_protocol::arp::{
    valid_signature_nonce, ArpFramePayload, FRAME_TYPE, SIGNATURE_NONCE_META_KEY,
};
use signalling_protocol::ticket::{KEYS_TYPE, KEY_EXCHANGE_META_KEY, RENEW_TYPE};
use signalling_protocol::{
    Body, Envelope, IceCandidatePayload, IceServer, OfferPayload, PkiResponsePayload,
    RegisterPayload, SessionMeta, Signalling, PROTOCOL_VERSION,
};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::config::ReconnectConfig;
use crate::identity::{IdentityError, RobotKey};
use crate::safety::Role;
use crate::tickets::{self, TicketCheck, Vouched};

/// Capacity of the outbound queue (answers, candidates, state reports).
pub const OUTBOUND_CAPACITY: usize = 256;
/// Capacity of the inbound queue towards the peer manager.
pub const INBOUND_CAPACITY: usize = 256;
/// Bound of each login step (connect, welcome, challenge, verification).
const STEP_TIMEOUT: Duration = Duration::from_secs(15);
/// Keepalive: a `signalling.ping` this often...
const PING_INTERVAL: Duration = Duration::from_secs(20);
/// ...and the connection counts as dead after this long without any frame.
const DEAD_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum SignallingError {
    #[error("connect: {0}")]
    Connect(String),
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    #[error("connection closed")]
    Closed,
    #[error("WebSocket: {0}")]
    WebSocket(String),
    #[error("server refused: {code}: {message}")]
    Refused { code: String, message: String },
    #[error("malformed challenge: {0}")]
    Challenge(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("no message for {0:?}; connection presumed dead")]
    Dead(Duration),
}

/// What the signalling client tells the peer manager.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// Registered and verified; sessions may start.
    Online {
        ice_servers: Vec<IceServer>,
    },
    /// New ICE servers (e.g. TURN credentials in a later welcome).
    IceServers(Vec<IceServer>),
    Offer {
        session: String,
        sdp: String,
        role: Role,
        subject: Option<String>,
        /// When the offer's session ticket runs out (Unix seconds); `None` when tickets
        /// are not checked. The session ends then unless a renewal extends it.
        ticket_expires: Option<u64>,
    },
    /// The server renewed a live session's ticket (`session.ticket`, checked).
    TicketRenewed {
        session: String,
        vouched: Vouched,
    },
    RemoteCandidate(IceCandidatePayload),
    /// The client left (or the server ended the session).
    Disconnected {
        session: String,
    },
    /// The connection to the server is gone; all sessions are void.
    Offline,
    /// One ARP frame of a gateway ARP session (`arp.frame`), with who calls
    /// according to the server's `meta.session` (`None`: none sent).
    ArpFrame {
        connection: String,
        frame: Value,
        session: Option<SessionMeta>,
        /// The program asked for frames signed by the robot, with this nonce.
        signature_nonce: Option<String>,
    },
}

/// How to reach the server and who we are.
#[derive(Clone)]
pub struct SignallingOptions {
    /// Servers, tried in turn (at least one).
    pub urls: Vec<String>,
    pub robot_id: String,
    pub key: Arc<RobotKey>,
    /// PEM chain presented in `register.metadata.certificate`.
    pub certificate: Option<String>,
    pub reconnect: ReconnectConfig,
    pub ca_file: Option<PathBuf>,
    /// Declare `register.metadata.arp` (the agent serves ARP through the
    /// server's gateway).
    pub arp: bool,
}

/// Starts the client task. Messages for the server go into the returned
/// sender; they are dropped while offline (sessions die with the link).
pub fn spawn(options: SignallingOptions, inbound: mpsc::Sender<Inbound>) -> mpsc::Sender<Envelope> {
    spawn_checked(options, None, inbound)
}

/// [`spawn`], checking session tickets with `tickets` (`None`: a robot that pinned no
/// key, which takes `meta.session` as it comes, as before tickets existed).
pub fn spawn_checked(
    options: SignallingOptions,
    tickets: Option<Arc<TicketCheck>>,
    inbound: mpsc::Sender<Inbound>,
) -> mpsc::Sender<Envelope> {
    let (out_tx, out_rx) = mpsc::channel(OUTBOUND_CAPACITY);
    tokio::spawn(run(options, tickets, inbound, out_rx));
    out_tx
}

async fn run(
    options: SignallingOptions,
    tickets: Option<Arc<TicketCheck>>,
    inbound: mpsc::Sender<Inbound>,
    mut out_rx: mpsc::Receiver<Envelope>,
) {
    let connector = match tls_connector(options.ca_file.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot set up TLS; signalling disabled");
            return;
        }
    };
    // `start` is the server we were last verified on; `failures` counts
    // attempts since, each on the next server of the list.
    let mut start: usize = 0;
    let mut failures: u32 = 0;
    loop {
        let mut online = false;
        let url = server_for(&options.urls, start, failures);
        let result = connection(
            &options,
            tickets.as_deref(),
            url,
            &connector,
            &inbound,
            &mut out_rx,
            &mut online,
        )
        .await;
        if inbound.is_closed() {
            return;
        }
        match &result {
            Err(SignallingError::Refused { code, message }) => {
                tracing::error!(%code, %message, "server refused the robot's login");
            }
            Err(e) => tracing::warn!(%url, error = %e, "signalling connection ended"),
            Ok(()) => {}
        }
        if online {
            // A verified session counts as success: start backing off anew,
            // with this server first.
            start = options
                .urls
                .iter()
                .position(|u| u == url)
                .unwrap_or_default();
            failures = 0;
            if inbound.send(Inbound::Offline).await.is_err() {
                return;
            }
        } else {
            failures = failures.saturating_add(1);
        }
        let delay = reconnect_delay(
            &options.reconnect,
            failures,
            options.urls.len(),
            random_unit(),
        );
        tracing::info!(
            delay_ms = delay.as_millis() as u64,
            next = server_for(&options.urls, start, failures),
            "reconnecting to the signalling server"
        );
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => break,
                // Whatever was queued belongs to sessions that are gone.
                message = out_rx.recv() => if message.is_none() { return },
            }
        }
    }
}

/// The server to try after `failures` failed attempts since the last
/// verified connection (to `urls[start]`): each failure moves on to the next.
pub fn server_for(urls: &[String], start: usize, failures: u32) -> &str {
    if urls.is_empty() {
        return "";
    }
    let i = (start + failures as usize) % urls.len();
    &urls[i]
}

/// The wait before the next attempt: within a round of the server list a
/// short random moment (so a fleet does not move to the next server at
/// once); after a whole round failed, or after a drop, the exponential
/// backoff of [`backoff_delay`] counted in rounds.
pub fn reconnect_delay(
    config: &ReconnectConfig,
    failures: u32,
    servers: usize,
    unit_random: f64,
) -> Duration {
    let servers = u32::try_from(servers.max(1)).unwrap_or(u32::MAX);
    if !failures.is_multiple_of(servers) {
        return Duration::from_secs_f64(
            config.initial().as_secs_f64() * unit_random.clamp(0.0, 1.0),
        );
    }
    let rounds = (failures / servers).saturating_sub(1);
    backoff_delay(config, rounds, unit_random)
}

/// Exponential backoff with "equal jitter": half the delay is fixed, half
/// random, so a fleet that lost the server at once does not return at once.
pub fn backoff_delay(config: &ReconnectConfig, attempt: u32, unit_random: f64) -> Duration {
    let initial = config.initial().as_secs_f64();
    let max = config.max().as_secs_f64();
    let base = (initial * 2f64.powi(attempt.min(30) as i32)).min(max);
    Duration::from_secs_f64(base / 2.0 + base / 2.0 * unit_random.clamp(0.0, 1.0))
}

fn random_unit() -> f64 {
    let mut bytes = [0u8; 8];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

fn tls_connector(
    ca_file: Option<&std::path::Path>,
) -> Result<tokio_tungstenite::Connector, SignallingError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SignallingError::Tls(format!("{}: {e}", path.display())))?;
        let blocks = pem::parse_many(&text)
            .map_err(|e| SignallingError::Tls(format!("{}: {e}", path.display())))?;
        for block in blocks.into_iter().filter(|b| b.tag() == "CERTIFICATE") {
            roots
                .add(rustls::pki_types::CertificateDer::from(
                    block.into_contents(),
                ))
                .map_err(|e| SignallingError::Tls(format!("{}: {e}", path.display())))?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| SignallingError::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_tungstenite::Connector::Rustls(Arc::new(config)))
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connection(
    options: &SignallingOptions,
    tickets: Option<&TicketCheck>,
    url: &str,
    connector: &tokio_tungstenite::Connector,
    inbound: &mpsc::Sender<Inbound>,
    out_rx: &mut mpsc::Receiver<Envelope>,
    online: &mut bool,
) -> Result<(), SignallingError> {
    let (mut ws, _) = tokio::time::timeout(
        STEP_TIMEOUT,
        tokio_tungstenite::connect_async_tls_with_config(url, None, false, Some(connector.clone())),
    )
    .await
    .map_err(|_| SignallingError::Timeout("the connection"))?
    .map_err(|e| SignallingError::Connect(e.to_string()))?;

    let ice_servers = login(&mut ws, options, tickets.is_some()).await?;
    tracing::info!(robot = %options.robot_id, %url, "registered and verified");
    *online = true;
    if inbound.send(Inbound::Online { ice_servers }).await.is_err() {
        return Ok(());
    }
    serve(&mut ws, tickets, inbound, out_rx).await
}

/// register → the PKI challenge → our signature → verified. Returns the
/// ICE servers of a welcome met on the way.
async fn login(
    ws: &mut Socket,
    options: &SignallingOptions,
    checks_tickets: bool,
) -> Result<Vec<IceServer>, SignallingError> {
    // Register at once: a server may greet a token-less socket with a
    // welcome (older servers) or not until it is asked to (issue 15), so
    // the login never waits for one. A welcome is taken whenever it comes.
    let mut ice_servers = Vec::new();
    send(ws, &register_message(options, checks_tickets)).await?;
    // The challenge: sign the decoded bytes, answer with its id.
    let (challenge_id, challenge) = login_step(
        ws,
        "the PKI challenge",
        &mut ice_servers,
        |envelope, s| match s {
            Signalling::PkiChallenge(c) => Some((envelope.id.clone(), c.challenge)),
            _ => None,
        },
    )
    .await?;
    let bytes = STANDARD
        .decode(challenge.trim())
        .map_err(|e| SignallingError::Challenge(e.to_string()))?;
    let signature = options.key.sign(&bytes)?;
    let response = Envelope::from_body(
        Signalling::PkiResponse(PkiResponsePayload {
            signature: STANDARD.encode(signature),
        }),
        PROTOCOL_VERSION,
    )
    .with_correlation(challenge_id);
    send(ws, &response).await?;
    login_step(ws, "verification", &mut ice_servers, |_, s| {
        matches!(s, Signalling::PkiVerified(_)).then_some(())
    })
    .await?;
    Ok(ice_servers)
}

/// Reads until `pick` takes a message: an error from the server refuses the
/// login, a welcome's ICE servers are kept, anything else is passed over.
async fn login_step<T>(
    ws: &mut Socket,
    what: &'static str,
    ice_servers: &mut Vec<IceServer>,
    pick: impl Fn(&Envelope, Signalling) -> Option<T>,
) -> Result<T, SignallingError> {
    loop {
        let envelope = next_envelope(ws, what).await?;
        match envelope.body() {
            Ok(Body::Signalling(Signalling::Error(e))) => {
                return Err(SignallingError::Refused {
                    code: e.code.to_string(),
                    message: e.message,
                })
            }
            Ok(Body::Signalling(Signalling::Welcome(w))) => {
                *ice_servers = w.ice_servers.unwrap_or_default()
            }
            Ok(Body::Signalling(s)) => {
                if let Some(picked) = pick(&envelope, s) {
                    return Ok(picked);
                }
                tracing::debug!(kind = %envelope.kind, "ignored before {what}");
            }
            _ => tracing::debug!(kind = %envelope.kind, "ignored before {what}"),
        }
    }
}

/// The logged-in socket: the server's messages to the peer manager, ours
/// to the server, pings, until either side ends.
async fn serve(
    ws: &mut Socket,
    tickets: Option<&TicketCheck>,
    inbound: &mpsc::Sender<Inbound>,
    out_rx: &mut mpsc::Receiver<Envelope>,
) -> Result<(), SignallingError> {
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.reset();
    let mut last_heard = tokio::time::Instant::now();
    loop {
        tokio::select! {
            frame = ws.next() => {
                let frame = match frame {
                    None => return Err(SignallingError::Closed),
                    Some(Err(e)) => return Err(SignallingError::WebSocket(e.to_string())),
                    Some(Ok(frame)) => frame,
                };
                last_heard = tokio::time::Instant::now();
                let text = match frame {
                    Message::Text(text) => text,
                    Message::Close(_) => return Err(SignallingError::Closed),
                    _ => continue,
                };
                let Some(event) = dispatch(&text, ws, tickets).await? else { continue };
                if inbound.send(event).await.is_err() {
                    return Ok(());
                }
            }
            message = out_rx.recv() => {
                let Some(mut message) = message else { return Ok(()) };
                if let Some(check) = tickets {
                    key_exchange_out(&mut message, check);
                }
                send(ws, &message).await?;
            }
            _ = ping.tick() => {
                if last_heard.elapsed() >= DEAD_AFTER {
                    return Err(SignallingError::Dead(DEAD_AFTER));
                }
                send(ws, &Envelope::from_body(Signalling::Ping, PROTOCOL_VERSION)).await?;
            }
        }
    }
}

/// Key of `register.metadata` asking the server for a `signalling.welcome`
/// after `pki_verified` (servers no longer greet token-less sockets
/// unasked); the agent needs the TURN credentials it carries.
pub const WANTS_WELCOME_KEY: &str = "wantsWelcome";

/// `signalling.register`: our id, and metadata merged from the agent's
/// version, the welcome request, the ARP version served through the
/// gateway, whether we take ticket renewals (when we check tickets) and,
/// with X.509 identity, the certificate chain.
fn register_message(options: &SignallingOptions, checks_tickets: bool) -> Envelope {
    let mut metadata = Map::new();
    metadata.insert(
        "agentVersion".into(),
        Value::String(env!("CARGO_PKG_VERSION").into()),
    );
    metadata.insert(WANTS_WELCOME_KEY.into(), Value::Bool(true));
    if let Some(chain) = &options.certificate {
        metadata.insert("certificate".into(), Value::String(chain.clone()));
    }
    if checks_tickets {
        metadata.insert(
            signalling_protocol::ticket::REGISTER_METADATA_KEY.into(),
            Value::Bool(true),
        );
    }
    if options.arp {
        metadata.insert(
            signalling_protocol::arp::REGISTER_METADATA_KEY.into(),
            Value::String(signalling_protocol::arp::ARP_VERSION.into()),
        );
    }
    Envelope::from_body(
        Signalling::Register(RegisterPayload {
            agent_id: options.robot_id.clone(),
            capabilities: None,
            metadata: Some(metadata),
        }),
        PROTOCOL_VERSION,
    )
}

/// Turns a server message into an event for the peer manager.
async fn dispatch(
    text: &str,
    ws: &mut Socket,
    tickets: Option<&TicketCheck>,
) -> Result<Option<Inbound>, SignallingError> {
    let envelope = match Envelope::parse(text) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable message from the server");
            return Ok(None);
        }
    };
    if envelope.kind == FRAME_TYPE {
        return match arp_frame(envelope, tickets) {
            Ok(frame) => Ok(frame),
            Err(refusal) => send(ws, &refusal).await.map(|()| None),
        };
    }
    if envelope.kind == RENEW_TYPE {
        return Ok(tickets.and_then(|check| ticket_renewal(&envelope, check)));
    }
    if envelope.kind == KEYS_TYPE {
        if let Some(check) = tickets {
            key_endorsement(&envelope, check);
        }
        return Ok(None);
    }
    let body = match envelope.body() {
        Ok(Body::Signalling(s)) => s,
        Ok(Body::Agent(_)) => return Ok(None),
        Err(e) => {
            tracing::warn!(kind = %envelope.kind, error = %e, "invalid message from the server");
            return Ok(None);
        }
    };
    Ok(match body {
        Signalling::Offer(offer) => offer_event(offer, envelope.meta.as_ref(), ws, tickets).await?,
        Signalling::IceCandidate(candidate) => Some(Inbound::RemoteCandidate(candidate)),
        Signalling::Disconnected(d) => {
            if let Some(check) = tickets {
                check.forget_session(&d.connection_id);
            }
            Some(Inbound::Disconnected {
                session: d.connection_id,
            })
        }
        Signalling::Welcome(w) => Some(Inbound::IceServers(w.ice_servers.unwrap_or_default())),
        Signalling::Ping => {
            let pong = Envelope::from_body(Signalling::Pong, PROTOCOL_VERSION)
                .with_correlation(envelope.id.clone());
            send(ws, &pong).await?;
            None
        }
        Signalling::Error(e) => {
            tracing::warn!(code = %e.code, message = %e.message, correlation = ?envelope.correlation_id, "server reported an error");
            None
        }
        _ => None,
    })
}

/// An offer as the peer manager takes it: the session the server vouched
/// for (its ticket checked when we check tickets), else a viewer's. A bad
/// ticket is refused here.
async fn offer_event(
    offer: OfferPayload,
    meta: Option<&Map<String, Value>>,
    ws: &mut Socket,
    tickets: Option<&TicketCheck>,
) -> Result<Option<Inbound>, SignallingError> {
    // Least privilege unless the server vouched for more.
    let mut session = SessionMeta::from_meta(meta);
    let mut ticket_expires = None;
    if let Some(check) = tickets {
        match check.offer(session.as_ref(), &offer.connection_id) {
            Ok(vouched) => {
                ticket_expires = Some(vouched.expires);
                session = Some(vouched.session);
            }
            Err(e) => {
                check.refuse("offer", &offer.connection_id, &e);
                send(ws, &tickets::offer_refusal(&offer.connection_id, &e)).await?;
                return Ok(None);
            }
        }
    }
    let role = session.as_ref().map_or(Role::Viewer, |s| s.role);
    let subject = session.map(|s| s.subject);
    Ok(Some(Inbound::Offer {
        session: offer.connection_id,
        sdp: offer.sdp,
        role,
        subject,
        ticket_expires,
    }))
}

/// What an outgoing message means for the ARP sessions' ticket keys: our half of a
/// session's exchange rides on its next `arp.frame`; a session's end drops its key.
fn key_exchange_out(message: &mut Envelope, check: &TicketCheck) {
    let connection = message
        .payload
        .as_ref()
        .and_then(|p| p.get("connectionId"))
        .and_then(Value::as_str);
    let Some(connection) = connection else {
        return;
    };
    if message.kind == FRAME_TYPE {
        if let Some(half) = check.unsent_key_half(connection) {
            let meta = message.meta.get_or_insert_with(Default::default);
            meta.insert(KEY_EXCHANGE_META_KEY.into(), Value::String(half));
        }
    } else if message.kind == "signalling.disconnected" {
        check.forget_session(connection);
    }
}

/// A `session.signing_keys`: a rotation's new key, endorsed by one we trust, is pinned.
fn key_endorsement(envelope: &Envelope, check: &TicketCheck) {
    let endorsement = envelope
        .payload
        .as_ref()
        .and_then(|p| p.get("endorsement"))
        .and_then(Value::as_str);
    match endorsement.map(|e| check.endorse(e)) {
        Some(Ok(added)) if !added.is_empty() => {
            tracing::info!(keys = %added.join(","), "pinned the server's new signing key, endorsed by a key we trust");
        }
        Some(Ok(_)) => {}
        Some(Err(e)) => tracing::warn!(error = %e, "server key endorsement refused"),
        None => tracing::warn!(id = %envelope.id, "session.signing_keys without an endorsement"),
    }
}

/// A `session.ticket`: the fresh ticket of a live session, checked as an offer's.
/// A bad one is refused and logged, and changes nothing: the session then ends when
/// its last good ticket runs out. No answer goes back (the server expects none).
fn ticket_renewal(envelope: &Envelope, check: &TicketCheck) -> Option<Inbound> {
    let session = envelope
        .payload
        .as_ref()
        .and_then(|p| p.get("connectionId"))
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty());
    let Some(session) = session else {
        tracing::warn!(id = %envelope.id, "session.ticket without a connectionId; dropped");
        return None;
    };
    let meta = SessionMeta::from_meta(envelope.meta.as_ref());
    match check.offer(meta.as_ref(), session) {
        Ok(vouched) => Some(Inbound::TicketRenewed {
            session: session.to_owned(),
            vouched,
        }),
        Err(e) => {
            check.refuse("ticket renewal", session, &e);
            None
        }
    }
}

/// An `arp.frame` from the server's gateway; a malformed one (e.g. a frame
/// that is not a JSON object) is logged and dropped, never answered. With
/// `tickets`, who sends it is the ticket's word; a frame without a good
/// ticket is refused (`Err`: the answer to send back, if any, else dropped).
fn arp_frame(
    envelope: Envelope,
    tickets: Option<&TicketCheck>,
) -> Result<Option<Inbound>, Box<Envelope>> {
    let p = match ArpFramePayload::from_envelope(&envelope) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(id = %envelope.id, error = %e, "malformed arp.frame from the server; dropped");
            return Ok(None);
        }
    };
    let mut session = SessionMeta::from_meta(envelope.meta.as_ref());
    if let Some(check) = tickets {
        match check.arp_frame(session.as_ref(), &p.connection_id, &p.frame) {
            Ok(vouched) => session = Some(vouched),
            Err(_) if tickets::is_emergency_stop(&p.frame) => {
                // Taken from anyone (see `is_emergency_stop`), with no privilege.
                let subject = session.map_or_else(|| "unknown".to_owned(), |s| s.subject);
                session = Some(SessionMeta::new(subject, Role::Viewer));
            }
            Err(e) => {
                check.refuse("arp.frame", &p.connection_id, &e);
                return match tickets::arp_refusal(&p.connection_id, &p.frame, &e) {
                    Some(answer) => Err(Box::new(answer)),
                    None => Ok(None),
                };
            }
        }
    }
    let signature_nonce = envelope
        .meta
        .as_ref()
        .and_then(|m| m.get(SIGNATURE_NONCE_META_KEY))
        .and_then(Value::as_str)
        .filter(|n| valid_signature_nonce(n))
        .map(str::to_owned);
    Ok(Some(Inbound::ArpFrame {
        connection: p.connection_id,
        frame: p.frame,
        session,
        signature_nonce,
    }))
}

async fn send(ws: &mut Socket, envelope: &Envelope) -> Result<(), SignallingError> {
    ws.send(Message::Text(envelope.to_json().into()))
        .await
        .map_err(|e| SignallingError::WebSocket(e.to_string()))
}

async fn next_envelope(ws: &mut Socket, what: &'static str) -> Result<Envelope, SignallingError> {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let frame = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| SignallingError::Timeout(what))?;
        match frame {
            None | Some(Ok(Message::Close(_))) => return Err(SignallingError::Closed),
            Some(Err(e)) => return Err(SignallingError::WebSocket(e.to_string())),
            Some(Ok(Message::Text(text))) => match Envelope::parse(&text) {
                Ok(envelope) => return Ok(envelope),
                Err(e) => tracing::warn!(error = %e, "unreadable message from the server"),
            },
            Some(Ok(_)) => {}
        }
    }
}

#[cfg(test)]
#[path = "signalling_tests.rs"]
mod tests;
