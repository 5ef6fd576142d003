//! WebRTC peers (webrtc-rs): one peer connection per session, several at
//! once. Answers offers (a `control` data channel, plus media m-lines: each
//! video m-line the browser receives on gets the next available camera's
//! shared track, answered `sendonly`; the rest `inactive`), serves `agent.*` on
//! every data channel the browser opens (an SDK may put movement on a second,
//! unordered `maxRetransmits: 0` channel), trickles ICE both ways,
//! reports `connected`/`disconnected` through signalling, and tears peers
//! down when the session ends, the peer drops or signalling is lost.
//!
//! A new offer in a live session (renegotiation, ICE restart) is answered
//! on the same peer connection: data channels, safety state and video
//! carry on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use signalling_protocol::ticket::EXPIRED_REASON;
use signalling_protocol::{
    AnswerPayload, AnswerSdpType, ConnectedIceState, ConnectedPayload, DataChannelState,
    DisconnectReason, DisconnectedPayload, Envelope, IceCandidatePayload, IceServer, Signalling,
    PROTOCOL_VERSION,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use webrtc::api::interceptor_registry::register_default_interceptors;
use webrtc::api::media_engine::MediaEngine;
use webrtc::api::setting_engine::SettingEngine;
use webrtc::api::{APIBuilder, API};
use webrtc::data_channel::data_channel_message::DataChannelMessage;
use webrtc::data_channel::RTCDataChannel;
use webrtc::ice::mdns::MulticastDnsMode;
use webrtc::ice_transport::ice_candidate::{RTCIceCandidate, RTCIceCandidateInit};
use webrtc::ice_transport::ice_connection_state::RTCIceConnectionState;
use webrtc::ice_transport::ice_server::RTCIceServer;
use webrtc::interceptor::registry::Registry;
use webrtc::peer_connection::configuration::RTCConfiguration;
use webrtc::peer_connection::peer_connection_state::RTCPeerConnectionState;
use webrtc::peer_connection::sdp::session_description::RTCSessionDescription;
use webrtc::peer_connection::RTCPeerConnection;
use webrtc::rtcp::payload_feedbacks::full_intra_request::FullIntraRequest;
use webrtc::rtcp::payload_feedbacks::picture_loss_indication::PictureLossIndication;
use webrtc::rtp_transceiver::rtp_transceiver_direction::RTCRtpTransceiverDirection;
use webrtc::rtp_transceiver::RTCRtpTransceiverInit;

use crate::arp::gateway::Gateway;
use crate::controller::control::Claimant;
use crate::messages;
use crate::safety::{Role, StopReason};
use crate::session::{Session, Shared};
use crate::signalling::Inbound;
use crate::tickets::{self, Vouched};
use crate::video::{Camera, CameraStatus};

/// Label of the data channel that carries `agent.*` messages.
pub const CONTROL_LABEL: &str = "control";
/// Label of the data channel that carries ARP (JSON-RPC).
pub const ARP_LABEL: &str = signalling_protocol::arp::DATA_CHANNEL_LABEL;
/// Most concurrent sessions; more offers are refused (a robot is not a
/// conference server).
pub const MAX_SESSIONS: usize = 16;
const EVENT_CAPACITY: usize = 256;
const CHANNEL_CAPACITY: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("WebRTC: {0}")]
    WebRtc(#[from] webrtc::Error),
    #[error("too many sessions ({MAX_SESSIONS})")]
    TooManySessions,
    /// An operator/owner offer while an ARP connection controls the robot.
    #[error("robot busy: another controller holds the robot")]
    RobotBusy,
    #[error("no local description after the answer")]
    NoLocalDescription,
}

impl PeerError {
    /// `details.reason` of the `disconnected` that refuses the offer.
    fn reason(&self) -> &'static str {
        match self {
            PeerError::RobotBusy => "robot_busy",
            _ => "error",
        }
    }
}

#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// Offer 127.0.0.1 candidates (same-host clients and tests).
    pub include_loopback_candidates: bool,
    /// Gather loopback candidates only, so no ICE traffic leaves the host
    /// (in-process tests).
    pub loopback_only: bool,
}

/// What webrtc-rs callbacks report to the manager.
enum PeerEvent {
    LocalCandidate {
        session: String,
        generation: u64,
        candidate: RTCIceCandidate,
    },
    IceState {
        session: String,
        generation: u64,
        state: RTCIceConnectionState,
    },
    PcState {
        session: String,
        generation: u64,
        state: RTCPeerConnectionState,
    },
    ChannelOpen {
        session: String,
        generation: u64,
    },
    ChannelClosed {
        session: String,
        generation: u64,
        label: String,
    },
    /// A data channel labelled `arp`: served by the ARP handler, not the
    /// `agent.*` session.
    ArpChannel {
        session: String,
        generation: u64,
        channel: Arc<RTCDataChannel>,
        frames: mpsc::Receiver<String>,
    },
}

impl PeerEvent {
    /// The session and the peer's generation the event is about.
    fn target(&self) -> (&str, u64) {
        match self {
            PeerEvent::LocalCandidate {
                session,
                generation,
                ..
            }
            | PeerEvent::IceState {
                session,
                generation,
                ..
            }
            | PeerEvent::PcState {
                session,
                generation,
                ..
            }
            | PeerEvent::ChannelOpen {
                session,
                generation,
            }
            | PeerEvent::ChannelClosed {
                session,
                generation,
                ..
            }
            | PeerEvent::ArpChannel {
                session,
                generation,
                ..
            } => (session, *generation),
        }
    }
}

/// What a session's data channels deliver to its one session task, so
/// that every channel shares the session's state (freshness, budget).
enum Incoming {
    Open(Arc<RTCDataChannel>),
    Text {
        text: String,
        /// Replies go back on the channel the request came in on.
        channel: Arc<RTCDataChannel>,
    },
}

struct PeerSession {
    /// Distinguishes a session from an earlier one of the same id, so late
    /// callbacks of a torn-down peer are ignored.
    generation: u64,
    pc: Arc<RTCPeerConnection>,
    role: Role,
    /// `mid` of the first m-line, used for our trickled candidates (BUNDLE).
    mid: String,
    ice_connected: bool,
    channel_open: bool,
    /// Data channels open now; the session ends with `control` or the last.
    channels_open: usize,
    connected_sent: bool,
    /// What the data channels deliver, until the first one opens and the
    /// session task takes it over.
    incoming: Option<mpsc::Receiver<Incoming>>,
    task: Option<JoinHandle<()>>,
    /// Cameras this session watches (released when it ends).
    watching: Vec<Arc<Camera>>,
    /// The session's subject, from `meta.session` (idempotency keys).
    subject: Option<String>,
    /// The ARP handler and writer of an `arp` channel, aborted with it.
    arp_tasks: Vec<JoinHandle<()>>,
    /// When the session's last good ticket runs out (Unix seconds), if tickets are
    /// checked: the session ends then unless the server renews it.
    ticket_expires: Option<u64>,
}

/// Owns every peer connection; driven by signalling events.
pub struct PeerManager {
    api: API,
    sessions: HashMap<String, PeerSession>,
    ice_servers: Vec<IceServer>,
    signalling: mpsc::Sender<Envelope>,
    shared: Shared,
    events_tx: mpsc::Sender<PeerEvent>,
    events_rx: mpsc::Receiver<PeerEvent>,
    next_generation: u64,
    cameras: Vec<Arc<Camera>>,
    arp: Option<crate::arp::ArpServer>,
    /// The server gateway's ARP sessions (`arp.frame`), served with `arp`.
    gateway: Option<Gateway>,
}

impl PeerManager {
    pub fn new(
        options: &PeerOptions,
        signalling: mpsc::Sender<Envelope>,
        shared: Shared,
    ) -> Result<PeerManager, PeerError> {
        let mut media = MediaEngine::default();
        // Codecs are registered so media m-lines can be matched and
        // answered (as inactive while the robot has no camera).
        media.register_default_codecs()?;
        let registry = register_default_interceptors(Registry::new(), &mut media)?;
        let mut settings = SettingEngine::default();
        // mDNS candidates need multicast, which robots' networks (and test
        // namespaces) often lack; browsers get plain host candidates.
        settings.set_ice_multicast_dns_mode(MulticastDnsMode::Disabled);
        settings.set_include_loopback_candidate(
            options.include_loopback_candidates || options.loopback_only,
        );
        if options.loopback_only {
            settings.set_ip_filter(Box::new(|ip: std::net::IpAddr| ip.is_loopback()));
        }
        // Notice a vanished browser within seconds, not the 25 s default:
        // the safety layer stops the robot when the peer drops.
        settings.set_ice_timeouts(
            Some(Duration::from_secs(3)),
            Some(Duration::from_secs(8)),
            Some(Duration::from_secs(1)),
        );
        let api = APIBuilder::new()
            .with_media_engine(media)
            .with_interceptor_registry(registry)
            .with_setting_engine(settings)
            .build();
        let (events_tx, events_rx) = mpsc::channel(EVENT_CAPACITY);
        Ok(PeerManager {
            api,
            sessions: HashMap::new(),
            ice_servers: Vec::new(),
            signalling,
            shared,
            events_tx,
            events_rx,
            next_generation: 1,
            cameras: Vec::new(),
            arp: None,
            gateway: None,
        })
    }

    /// The robot's cameras, offered to every session that asks for video.
    pub fn with_cameras(mut self, cameras: Vec<Arc<Camera>>) -> PeerManager {
        self.cameras = cameras;
        self
    }

    /// Runs until `inbound` closes (the agent shuts down).
    pub async fn run(mut self, mut inbound: mpsc::Receiver<Inbound>) {
        loop {
            let lapse = ticket_lapse(self.next_ticket_expiry());
            tokio::select! {
                message = inbound.recv() => {
                    let Some(message) = message else { break };
                    self.inbound(message).await;
                }
                Some(event) = self.events_rx.recv() => self.event(event).await,
                ended = gateway_end(&mut self.gateway) => {
                    if let Some(gateway) = &mut self.gateway {
                        gateway.ended(ended);
                    }
                }
                () = lapse => self.end_lapsed_sessions().await,
            }
        }
        if let Some(gateway) = &mut self.gateway {
            gateway.close_all();
        }
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        for id in ids {
            self.teardown(&id, StopReason::Shutdown, Some(DisconnectReason::Closed))
                .await;
        }
    }

    /// Serves data channels labelled `arp`, and the server gateway's ARP
    /// sessions (`arp.frame` on the signalling socket), with this ARP
    /// server.
    pub fn with_arp(mut self, arp: crate::arp::ArpServer) -> PeerManager {
        self.gateway = Some(Gateway::new(arp.clone(), self.signalling.clone()));
        self.arp = Some(arp);
        self
    }

    /// Number of live sessions (diagnostics, tests).
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    async fn inbound(&mut self, message: Inbound) {
        match message {
            Inbound::Online { ice_servers } | Inbound::IceServers(ice_servers) => {
                self.ice_servers = ice_servers;
            }
            Inbound::Offer {
                session,
                sdp,
                role,
                subject,
                ticket_expires,
            } => {
                self.offered(session, sdp, role, subject, ticket_expires)
                    .await
            }
            Inbound::TicketRenewed { session, vouched } => self.renewed(&session, vouched).await,
            Inbound::RemoteCandidate(c) => self.remote_candidate(c).await,
            Inbound::Disconnected { session } => {
                if let Some(gateway) = &mut self.gateway {
                    if gateway.disconnected(&session) {
                        return;
                    }
                }
                // The server already knows; no disconnected goes back.
                self.teardown(&session, StopReason::SessionEnded, None)
                    .await;
            }
            Inbound::ArpFrame {
                connection,
                frame,
                session,
                signature_nonce,
            } => match &mut self.gateway {
                Some(gateway) => gateway.frame(connection, frame, session, signature_nonce),
                None => {
                    tracing::warn!(%connection, "arp.frame, but ARP is not served");
                    let why = signalling_protocol::arp::reason::ARP_UNSUPPORTED;
                    self.send_disconnected(
                        &connection,
                        DisconnectReason::Failed,
                        Some((why, "this robot serves no ARP".into())),
                    );
                }
            },
            Inbound::Offline => {
                // Gateway sessions end with the socket that carried them.
                if let Some(gateway) = &mut self.gateway {
                    gateway.close_all();
                }
                let ids: Vec<String> = self.sessions.keys().cloned().collect();
                for id in ids {
                    self.teardown(&id, StopReason::SignallingLost, None).await;
                }
                self.shared
                    .controller
                    .stop_all(StopReason::SignallingLost)
                    .await;
            }
        }
    }

    /// An offer: answered, or refused with a `disconnected` (the session,
    /// if it was one already, torn down).
    async fn offered(
        &mut self,
        session: String,
        sdp: String,
        role: Role,
        subject: Option<String>,
        ticket_expires: Option<u64>,
    ) {
        tracing::info!(%session, role = role.as_str(), subject = subject.as_deref().unwrap_or("-"), "offer");
        let offered = self.offer(&session, sdp, role, subject).await;
        if let (Ok(()), Some(peer)) = (&offered, self.sessions.get_mut(&session)) {
            peer.ticket_expires = peer.ticket_expires.max(ticket_expires);
        }
        if let Err(e) = offered {
            tracing::warn!(%session, error = %e, "cannot answer the offer");
            let existed = self.sessions.contains_key(&session);
            if existed {
                self.teardown(
                    &session,
                    StopReason::SessionEnded,
                    Some(DisconnectReason::Failed),
                )
                .await;
            } else {
                self.send_disconnected(
                    &session,
                    DisconnectReason::Failed,
                    Some((e.reason(), e.to_string())),
                );
            }
        }
    }

    async fn remote_candidate(&mut self, c: IceCandidatePayload) {
        let Some(peer) = self.sessions.get(&c.connection_id) else {
            tracing::debug!(session = %c.connection_id, "candidate for no session");
            return;
        };
        if c.candidate.trim().is_empty() {
            return; // end-of-candidates marker
        }
        let init = RTCIceCandidateInit {
            candidate: c.candidate,
            sdp_mid: Some(c.sdp_mid),
            sdp_mline_index: u16::try_from(c.sdp_m_line_index).ok(),
            username_fragment: c.username_fragment,
        };
        if let Err(e) = peer.pc.add_ice_candidate(init).await {
            tracing::debug!(session = %c.connection_id, error = %e, "remote candidate refused");
        }
    }

    async fn offer(
        &mut self,
        session: &str,
        sdp: String,
        role: Role,
        subject: Option<String>,
    ) -> Result<(), PeerError> {
        let description = RTCSessionDescription::offer(sdp)?;
        if let Some(peer) = self.sessions.get(session) {
            // Renegotiation (or ICE restart) of a live session: same peer
            // connection, so channels and safety state carry on.
            let pc = peer.pc.clone();
            let restart = is_ice_restart(pc_remote_ufrag(&pc).await, &description.sdp);
            tracing::info!(%session, ice_restart = restart, "new offer in a live session");
            let watching = peer.watching.clone();
            let free: Vec<_> = self
                .cameras
                .iter()
                .filter(|c| !watching.iter().any(|w| Arc::ptr_eq(w, c)))
                .cloned()
                .collect();
            let (answer, attached) = answer(&pc, description, &free).await?;
            for camera in &attached {
                camera.acquire();
            }
            if let Some(peer) = self.sessions.get_mut(session) {
                peer.mid = first_mid(&answer.sdp).unwrap_or_else(|| peer.mid.clone());
                peer.watching.extend(attached);
            }
            self.send_answer(session, answer.sdp);
            return Ok(());
        }
        // One controller: a driving session takes control before anything
        // is set up (or a viewer evicted) for it, and gives it back if it
        // cannot be set up.
        if role.may_drive() {
            let who = Claimant::Teleop(session.to_owned());
            if self.shared.controller.take_control(&who).is_err() {
                return Err(PeerError::RobotBusy);
            }
        }
        let opened = self.open(session, description, role, subject).await;
        if opened.is_err() {
            self.shared.controller.release_control(session);
        }
        opened
    }

    /// Sets up a new session's peer connection and answers its offer.
    async fn open(
        &mut self,
        session: &str,
        description: RTCSessionDescription,
        role: Role,
        subject: Option<String>,
    ) -> Result<(), PeerError> {
        self.make_room(role).await?;
        let generation = self.next_generation;
        self.next_generation += 1;
        let config = RTCConfiguration {
            ice_servers: self
                .ice_servers
                .iter()
                .map(|s| RTCIceServer {
                    urls: s.urls.clone(),
                    username: s.username.clone().unwrap_or_default(),
                    credential: s.credential.clone().unwrap_or_default(),
                })
                .collect(),
            ..Default::default()
        };
        let pc = Arc::new(self.api.new_peer_connection(config).await?);
        // Queued from the start so no message is lost between a channel's
        // "open" and the session task taking over.
        let (incoming_tx, incoming) = mpsc::channel(CHANNEL_CAPACITY);
        self.register_callbacks(&pc, session, generation, incoming_tx);
        let (answer, watching) = match answer(&pc, description, &self.cameras).await {
            Ok(a) => a,
            Err(e) => {
                let _ = pc.close().await;
                return Err(e);
            }
        };
        for camera in &watching {
            camera.acquire();
        }
        let mid = first_mid(&answer.sdp).unwrap_or_else(|| "0".to_owned());
        self.sessions.insert(
            session.to_owned(),
            PeerSession {
                generation,
                pc,
                role,
                mid,
                ice_connected: false,
                channel_open: false,
                channels_open: 0,
                connected_sent: false,
                incoming: Some(incoming),
                task: None,
                watching,
                subject,
                arp_tasks: Vec::new(),
                ticket_expires: None,
            },
        );
        self.send_answer(session, answer.sdp);
        Ok(())
    }

    /// The earliest time a session's ticket runs out, if any session has one.
    fn next_ticket_expiry(&self) -> Option<u64> {
        self.sessions
            .values()
            .filter_map(|p| p.ticket_expires)
            .min()
    }

    /// A live session's fresh ticket: it lives on, as long as the ticket names the same
    /// subject and role (anything else is not a renewal: the session ends).
    async fn renewed(&mut self, session: &str, vouched: Vouched) {
        let Some(peer) = self.sessions.get_mut(session) else {
            tracing::debug!(%session, "ticket renewal for no session");
            return;
        };
        let same = peer.role == vouched.session.role
            && peer.subject.as_deref() == Some(vouched.session.subject.as_str());
        if same {
            peer.ticket_expires = peer.ticket_expires.max(Some(vouched.expires));
            return;
        }
        tracing::warn!(%session, "a renewed ticket names another subject or role; session ended");
        self.teardown(session, StopReason::SessionEnded, None).await;
        let why = "the renewed ticket names another subject or role".to_owned();
        self.send_disconnected(
            session,
            DisconnectReason::Failed,
            Some((signalling_protocol::arp::reason::BAD_TICKET, why)),
        );
    }

    /// Ends the sessions whose last ticket ran out unrenewed: the server no longer vouches
    /// for them (it cut them and the notice was lost, or it is gone).
    async fn end_lapsed_sessions(&mut self) {
        let now = tickets::unix_now();
        let lapsed: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, p)| {
                p.ticket_expires
                    .is_some_and(|exp| exp + tickets::LEEWAY_SECS < now)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for session in lapsed {
            tracing::warn!(%session, "session ticket ran out unrenewed; session ended");
            self.teardown(&session, StopReason::TicketExpired, None)
                .await;
            self.send_disconnected(
                &session,
                DisconnectReason::Failed,
                Some((
                    EXPIRED_REASON,
                    "the session's ticket ran out unrenewed".into(),
                )),
            );
        }
    }

    /// Keeps a slot for a controller: viewers may hold at most
    /// `MAX_SESSIONS - 1` sessions, and an operator or owner finding the
    /// agent full evicts the oldest viewer (issue 29).
    async fn make_room(&mut self, role: Role) -> Result<(), PeerError> {
        let viewers = self
            .sessions
            .values()
            .filter(|s| !s.role.may_drive())
            .count();
        if !role.may_drive() {
            return if viewers >= MAX_SESSIONS - 1 || self.sessions.len() >= MAX_SESSIONS {
                Err(PeerError::TooManySessions)
            } else {
                Ok(())
            };
        }
        if self.sessions.len() < MAX_SESSIONS {
            return Ok(());
        }
        let oldest = self
            .sessions
            .iter()
            .filter(|(_, s)| !s.role.may_drive())
            .min_by_key(|(_, s)| s.generation)
            .map(|(id, _)| id.clone());
        let Some(oldest) = oldest else {
            return Err(PeerError::TooManySessions);
        };
        tracing::warn!(session = %oldest, "agent full; the oldest viewer session gives way to a controller");
        self.teardown(
            &oldest,
            StopReason::SessionEnded,
            Some(DisconnectReason::Closed),
        )
        .await;
        Ok(())
    }

    fn register_callbacks(
        &self,
        pc: &Arc<RTCPeerConnection>,
        session: &str,
        generation: u64,
        incoming: mpsc::Sender<Incoming>,
    ) {
        let events = self.events_tx.clone();
        let id = session.to_owned();
        pc.on_ice_candidate(Box::new(move |candidate: Option<RTCIceCandidate>| {
            let events = events.clone();
            let session = id.clone();
            Box::pin(async move {
                if let Some(candidate) = candidate {
                    let _ = events
                        .send(PeerEvent::LocalCandidate {
                            session,
                            generation,
                            candidate,
                        })
                        .await;
                }
            })
        }));
        let events = self.events_tx.clone();
        let id = session.to_owned();
        pc.on_ice_connection_state_change(Box::new(move |state: RTCIceConnectionState| {
            let events = events.clone();
            let session = id.clone();
            Box::pin(async move {
                let _ = events
                    .send(PeerEvent::IceState {
                        session,
                        generation,
                        state,
                    })
                    .await;
            })
        }));
        let events = self.events_tx.clone();
        let id = session.to_owned();
        pc.on_peer_connection_state_change(Box::new(move |state: RTCPeerConnectionState| {
            let events = events.clone();
            let session = id.clone();
            Box::pin(async move {
                let _ = events
                    .send(PeerEvent::PcState {
                        session,
                        generation,
                        state,
                    })
                    .await;
            })
        }));
        let events = self.events_tx.clone();
        let id = session.to_owned();
        pc.on_data_channel(Box::new(move |channel: Arc<RTCDataChannel>| {
            let events = events.clone();
            let session = id.clone();
            let incoming = incoming.clone();
            Box::pin(async move {
                tracing::debug!(%session, label = channel.label(), ordered = channel.ordered(), "data channel");
                if channel.label() == ARP_LABEL {
                    arp_channel(channel, session, generation, events).await;
                    return;
                }
                agent_channel(channel, session, generation, events, incoming);
            })
        }));
    }

    async fn event(&mut self, event: PeerEvent) {
        let (session, generation) = event.target();
        let session = session.to_owned();
        let current = self.sessions.get(&session);
        if current.is_none_or(|p| p.generation != generation) {
            return; // a late callback of a peer that is gone
        }
        match event {
            PeerEvent::LocalCandidate { candidate, .. } => {
                self.local_candidate(&session, &candidate)
            }
            PeerEvent::IceState { state, .. } => self.ice_state(&session, state).await,
            PeerEvent::PcState { state, .. } => self.pc_state(&session, state).await,
            PeerEvent::ChannelOpen { .. } => self.channel_open(&session).await,
            PeerEvent::ArpChannel {
                channel, frames, ..
            } => self.arp_channel(&session, channel, frames),
            PeerEvent::ChannelClosed { label, .. } => self.channel_closed(&session, &label).await,
        }
    }

    fn local_candidate(&mut self, session: &str, candidate: &RTCIceCandidate) {
        let Some(peer) = self.sessions.get(session) else {
            return;
        };
        let Ok(init) = candidate.to_json() else {
            return;
        };
        let payload = IceCandidatePayload {
            connection_id: session.to_owned(),
            candidate: init.candidate,
            sdp_mid: peer.mid.clone(),
            sdp_m_line_index: 0,
            username_fragment: None,
        };
        self.send(Signalling::IceCandidate(payload));
    }

    async fn ice_state(&mut self, session: &str, state: RTCIceConnectionState) {
        tracing::debug!(%session, %state, "ICE state");
        let Some(peer) = self.sessions.get_mut(session) else {
            return;
        };
        match state {
            RTCIceConnectionState::Connected | RTCIceConnectionState::Completed => {
                peer.ice_connected = true;
                self.maybe_connected(session);
            }
            RTCIceConnectionState::Disconnected => {
                // Transient maybe, but the robot must not keep
                // driving blind: stop now, keep the session.
                peer.ice_connected = false;
                self.shared
                    .controller
                    .interrupted(session, StopReason::PeerDisconnected)
                    .await;
            }
            _ => {}
        }
    }

    async fn pc_state(&mut self, session: &str, state: RTCPeerConnectionState) {
        tracing::info!(%session, %state, "peer connection state");
        let reason = match state {
            RTCPeerConnectionState::Failed => DisconnectReason::Failed,
            RTCPeerConnectionState::Closed => DisconnectReason::Closed,
            _ => return,
        };
        self.teardown(session, StopReason::PeerDisconnected, Some(reason))
            .await;
    }

    async fn channel_open(&mut self, session: &str) {
        let Some(peer) = self.sessions.get_mut(session) else {
            return;
        };
        peer.channel_open = true;
        peer.channels_open += 1;
        // The first channel to open starts the session's one task.
        if let Some(incoming) = peer.incoming.take() {
            let (outbox_tx, outbox_rx) = mpsc::channel(CHANNEL_CAPACITY);
            self.shared.controller.attach(session, outbox_tx).await;
            let worker = Session::new(session.to_owned(), peer.role, self.shared.clone());
            peer.task = Some(tokio::spawn(channel_task(
                worker,
                incoming,
                outbox_rx,
                self.cameras.clone(),
            )));
        }
        self.maybe_connected(session);
    }

    /// Serves a data channel labelled `arp` with the ARP server, in the
    /// session's role.
    fn arp_channel(
        &mut self,
        session: &str,
        channel: Arc<RTCDataChannel>,
        frames: mpsc::Receiver<String>,
    ) {
        let Some(peer) = self.sessions.get_mut(session) else {
            return;
        };
        let Some(arp) = &self.arp else {
            tracing::warn!(%session, "arp data channel, but ARP is not enabled");
            return;
        };
        let (out_tx, mut out_rx) = mpsc::channel::<String>(crate::arp::FRAME_CHANNEL);
        let handler = arp.connect(
            crate::arp::Peer {
                key: format!("{session}/arp"),
                session: Some(session.to_owned()),
                role: peer.role,
                subject: peer.subject.clone().unwrap_or_else(|| session.to_owned()),
            },
            frames,
            out_tx,
        );
        let writer = tokio::spawn(async move {
            while let Some(text) = out_rx.recv().await {
                if let Err(e) = channel.send_text(text).await {
                    tracing::debug!(error = %e, "arp data channel send failed");
                    break;
                }
            }
        });
        peer.arp_tasks.extend([handler, writer]);
    }

    async fn channel_closed(&mut self, session: &str, label: &str) {
        let Some(peer) = self.sessions.get_mut(session) else {
            return;
        };
        peer.channels_open = peer.channels_open.saturating_sub(1);
        if label == ARP_LABEL {
            // The ARP connection ends with its channel (its calls
            // are cancelled, control released).
            for task in peer.arp_tasks.drain(..) {
                task.abort();
            }
        }
        if label == CONTROL_LABEL || peer.channels_open == 0 {
            self.teardown(
                session,
                StopReason::SessionEnded,
                Some(DisconnectReason::Closed),
            )
            .await;
        }
    }

    fn maybe_connected(&mut self, session: &str) {
        let Some(peer) = self.sessions.get_mut(session) else {
            return;
        };
        if peer.ice_connected && peer.channel_open && !peer.connected_sent {
            peer.connected_sent = true;
            tracing::info!(%session, "session connected");
            self.send(Signalling::Connected(ConnectedPayload {
                connection_id: session.to_owned(),
                ice_connection_state: ConnectedIceState::Connected,
                data_channel_state: Some(DataChannelState::Open),
            }));
        }
    }

    /// Ends a session: stops its channel task, tells the controller (which
    /// stops the robot if this session was driving), closes the peer, and
    /// reports `disconnected` unless the server told us.
    async fn teardown(
        &mut self,
        session: &str,
        stop: StopReason,
        report: Option<DisconnectReason>,
    ) {
        let Some(peer) = self.sessions.remove(session) else {
            return;
        };
        tracing::info!(
            %session,
            reason = stop.as_str(),
            stale_commands_total = self.shared.metrics.stale_commands(),
            "session ended"
        );
        if let Some(task) = peer.task {
            task.abort();
        }
        for task in &peer.arp_tasks {
            task.abort();
        }
        for camera in &peer.watching {
            camera.release();
        }
        self.shared.controller.detach(session, stop).await;
        // Closing waits for ICE/DTLS/SCTP to wind down; do not hold up other
        // sessions for it.
        let pc = peer.pc;
        tokio::spawn(async move {
            if let Err(e) = pc.close().await {
                tracing::debug!(error = %e, "closing peer connection");
            }
        });
        if let Some(reason) = report {
            self.send_disconnected(session, reason, None);
        }
    }

    fn send_answer(&self, session: &str, sdp: String) {
        self.send(Signalling::Answer(AnswerPayload {
            connection_id: session.to_owned(),
            sdp_type: AnswerSdpType::Answer,
            sdp,
        }));
    }

    /// `error` is `(details.reason, message)`.
    fn send_disconnected(
        &self,
        session: &str,
        reason: DisconnectReason,
        error: Option<(&str, String)>,
    ) {
        let details = error
            .map(|(why, e)| messages::details(why, &[("error", serde_json::Value::String(e))]));
        self.send(Signalling::Disconnected(DisconnectedPayload {
            connection_id: session.to_owned(),
            reason,
            ice_connection_state: None,
            details,
        }));
    }

    fn send(&self, message: Signalling) {
        let envelope = Envelope::from_body(message, PROTOCOL_VERSION);
        if self.signalling.try_send(envelope).is_err() {
            tracing::warn!("signalling queue full or closed; message dropped");
        }
    }
}

/// Resolves once a ticket expiring at `expires` (Unix seconds) can no longer pass,
/// leeway included; never, without one.
async fn ticket_lapse(expires: Option<u64>) {
    let Some(expires) = expires else {
        return std::future::pending().await;
    };
    let lapse = std::time::UNIX_EPOCH + Duration::from_secs(expires + tickets::LEEWAY_SECS + 1);
    let wait = lapse
        .duration_since(std::time::SystemTime::now())
        .unwrap_or(Duration::ZERO);
    tokio::time::sleep(wait).await;
}

/// The next gateway ARP session that ended on the robot's side; never,
/// without a gateway.
async fn gateway_end(gateway: &mut Option<Gateway>) -> (String, u64) {
    match gateway {
        Some(gateway) => gateway.next_ended().await,
        None => std::future::pending().await,
    }
}

/// Applies the offer and returns the (local) answer with the cameras it
/// attached. Each new recvonly video m-line of the offer gets the next
/// available camera (a sendonly transceiver made before the offer is
/// applied, so webrtc-rs pairs the two); media m-lines left without a
/// track are made inactive.
async fn answer(
    pc: &RTCPeerConnection,
    offer: RTCSessionDescription,
    cameras: &[Arc<Camera>],
) -> Result<(RTCSessionDescription, Vec<Arc<Camera>>), PeerError> {
    let mut known = Vec::new();
    for t in pc.get_transceivers().await {
        if let Some(mid) = t.mid() {
            known.push(mid.to_string());
        }
    }
    let wanted = recvonly_video_lines(&offer.sdp, &known);
    let mut attached = Vec::new();
    for camera in cameras.iter().filter(|c| c.available()).take(wanted) {
        let transceiver = pc
            .add_transceiver_from_track(
                camera.track(),
                Some(RTCRtpTransceiverInit {
                    direction: RTCRtpTransceiverDirection::Sendonly,
                    send_encodings: vec![],
                }),
            )
            .await?;
        // webrtc-rs's interceptors (NACK responder, reports) run on RTCP
        // reads; PLI/FIR are counted for the camera.
        let reader = transceiver.sender().await;
        let counted = camera.clone();
        tokio::spawn(async move {
            while let Ok((packets, _)) = reader.read_rtcp().await {
                for packet in packets {
                    let any = packet.as_any();
                    if any.is::<PictureLossIndication>() || any.is::<FullIntraRequest>() {
                        counted.keyframe_requested();
                    }
                }
            }
        });
        attached.push(camera.clone());
    }
    pc.set_remote_description(offer).await?;
    for transceiver in pc.get_transceivers().await {
        let has_track = transceiver.sender().await.track().await.is_some();
        if !has_track {
            transceiver
                .set_direction(RTCRtpTransceiverDirection::Inactive)
                .await;
        }
    }
    let answer = pc.create_answer(None).await?;
    pc.set_local_description(answer).await?;
    let local = pc
        .local_description()
        .await
        .ok_or(PeerError::NoLocalDescription)?;
    Ok((local, attached))
}

/// Video m-lines of an offer that the browser receives on (recvonly, not
/// rejected) and that are not already negotiated (`known` mids).
fn recvonly_video_lines(sdp: &str, known: &[String]) -> usize {
    sdp.split("\nm=")
        .skip(1)
        .filter(|section| {
            let mut parts = section.split_whitespace();
            let video = parts.next() == Some("video");
            let rejected = parts.next() == Some("0");
            let recvonly = section.lines().any(|l| l.trim() == "a=recvonly");
            let mid = section
                .lines()
                .find_map(|l| l.trim().strip_prefix("a=mid:"));
            video && !rejected && recvonly && !mid.is_some_and(|m| known.iter().any(|k| k == m))
        })
        .count()
}

/// The browser's current ICE username fragment, to tell an ICE restart
/// (new credentials) from other renegotiation in the log.
async fn pc_remote_ufrag(pc: &RTCPeerConnection) -> Option<String> {
    let remote = pc.remote_description().await?;
    ice_ufrag(&remote.sdp)
}

fn ice_ufrag(sdp: &str) -> Option<String> {
    sdp.lines()
        .find_map(|l| l.trim().strip_prefix("a=ice-ufrag:"))
        .map(str::to_owned)
}

fn is_ice_restart(previous: Option<String>, offer: &str) -> bool {
    previous.is_some() && ice_ufrag(offer) != previous
}

fn first_mid(sdp: &str) -> Option<String> {
    sdp.lines()
        .find_map(|l| l.trim().strip_prefix("a=mid:"))
        .map(str::to_owned)
}

/// A data channel message as text; a binary one as text that parses as
/// nothing.
fn text_of(message: &DataChannelMessage) -> String {
    if message.is_string {
        String::from_utf8_lossy(&message.data).into_owned()
    } else {
        String::from("binary frame")
    }
}

/// Tells the manager when `channel` closes.
fn report_close(
    channel: &RTCDataChannel,
    session: String,
    generation: u64,
    events: mpsc::Sender<PeerEvent>,
) {
    let label = channel.label().to_owned();
    channel.on_close(Box::new(move || {
        let events = events.clone();
        let session = session.clone();
        let label = label.clone();
        Box::pin(async move {
            let _ = events
                .send(PeerEvent::ChannelClosed {
                    session,
                    generation,
                    label,
                })
                .await;
        })
    }));
}

/// Wires a data channel of the `agent.*` protocol to the session's task
/// (`incoming`) and its opening and closing to the manager (`events`).
fn agent_channel(
    channel: Arc<RTCDataChannel>,
    session: String,
    generation: u64,
    events: mpsc::Sender<PeerEvent>,
    incoming: mpsc::Sender<Incoming>,
) {
    // The await in the handler is backpressure onto SCTP, not a
    // drop.
    let message_channel = channel.clone();
    let message_incoming = incoming.clone();
    channel.on_message(Box::new(move |message: DataChannelMessage| {
        let incoming = message_incoming.clone();
        let channel = message_channel.clone();
        Box::pin(async move {
            // Binary frames are not part of the protocol: the parser
            // answers INVALID_MESSAGE.
            let text = text_of(&message);
            let _ = incoming.send(Incoming::Text { text, channel }).await;
        })
    }));
    let open_events = events.clone();
    let open_session = session.clone();
    let open_channel = channel.clone();
    channel.on_open(Box::new(move || {
        Box::pin(async move {
            let _ = incoming.send(Incoming::Open(open_channel)).await;
            let _ = open_events
                .send(PeerEvent::ChannelOpen {
                    session: open_session,
                    generation,
                })
                .await;
        })
    }));
    report_close(&channel, session, generation, events);
}

/// Wires an `arp` data channel: its frames go to a queue the manager
/// hands to the ARP handler; opening and closing count like any channel.
async fn arp_channel(
    channel: Arc<RTCDataChannel>,
    session: String,
    generation: u64,
    events: mpsc::Sender<PeerEvent>,
) {
    let (frames_tx, frames) = mpsc::channel(crate::arp::FRAME_CHANNEL);
    channel.on_message(Box::new(move |message: DataChannelMessage| {
        let frames = frames_tx.clone();
        Box::pin(async move {
            // A binary frame is not JSON: the handler answers a parse error.
            let text = text_of(&message);
            // Backpressure onto SCTP, not a drop.
            let _ = frames.send(text).await;
        })
    }));
    let open_events = events.clone();
    let open_session = session.clone();
    channel.on_open(Box::new(move || {
        Box::pin(async move {
            let _ = open_events
                .send(PeerEvent::ChannelOpen {
                    session: open_session,
                    generation,
                })
                .await;
        })
    }));
    report_close(&channel, session.clone(), generation, events.clone());
    let _ = events
        .send(PeerEvent::ArpChannel {
            session,
            generation,
            channel,
            frames,
        })
        .await;
}

/// Aborts a session's camera watchers with it (the session task itself is
/// aborted at teardown, so this runs on drop).
struct Watchers(Vec<JoinHandle<()>>);

impl Drop for Watchers {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}

/// Tasks that report each camera's changes as (index, status; `None` after
/// a lag: read the state now); they end when dropped.
fn watch_cameras(
    cameras: &[Arc<Camera>],
) -> (Watchers, mpsc::Receiver<(usize, Option<CameraStatus>)>) {
    let (change_tx, changes) = mpsc::channel::<(usize, Option<CameraStatus>)>(8);
    let watchers = Watchers(
        cameras
            .iter()
            .enumerate()
            .map(|(index, camera)| {
                let mut rx = camera.subscribe();
                let tx = change_tx.clone();
                tokio::spawn(async move {
                    loop {
                        // Each change as it happened (a quick fail-and-return
                        // is two notices); after a lag, the state now.
                        let status = match rx.recv().await {
                            Ok(status) => Some(status),
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                        };
                        if tx.send((index, status)).await.is_err() {
                            return;
                        }
                    }
                })
            })
            .collect(),
    );
    (watchers, changes)
}

/// Pumps one session's data channels: requests in (from any channel, each
/// answered on its own), controller messages out on the primary channel
/// (`control`, else the first to open), and the freshness gate's timer.
async fn channel_task(
    mut session: Session,
    mut incoming: mpsc::Receiver<Incoming>,
    mut outbox: mpsc::Receiver<Envelope>,
    cameras: Vec<Arc<Camera>>,
) {
    let mut primary: Option<Arc<RTCDataChannel>> = None;
    // Cameras that fail or come back while the session runs are announced
    // on it: an `agent.error` for a failure, fresh capabilities either way.
    let (_watchers, mut changes) = watch_cameras(&cameras);
    let mut current: Vec<CameraStatus> = cameras.iter().map(|c| c.status()).collect();
    loop {
        // A far deadline stands for "none": the branch is disabled then.
        let deadline = session.deadline();
        let timer = tokio::time::sleep_until(
            deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600)),
        );
        let (outgoing, target) = tokio::select! {
            item = incoming.recv() => match item {
                Some(Incoming::Open(channel)) => {
                    if primary.is_some() && channel.label() != CONTROL_LABEL {
                        continue;
                    }
                    primary = Some(channel.clone());
                    // Capabilities list the cameras; each unavailable one is
                    // also said plainly in an error.
                    let statuses: Vec<_> = cameras.iter().map(|c| c.status()).collect();
                    current = statuses.clone();
                    let mut greeting = vec![messages::capabilities(&statuses)];
                    greeting.extend(statuses.iter().filter(|s| !s.available).map(messages::camera_unavailable));
                    (greeting, Some(channel))
                }
                Some(Incoming::Text { text, channel }) => (session.handle_text(&text).await, Some(channel)),
                None => break,
            },
            message = outbox.recv() => match message {
                Some(m) => (vec![m], primary.clone()),
                None => break,
            },
            () = timer, if deadline.is_some() => (session.on_deadline().await, primary.clone()),
            Some((index, status)) = changes.recv() => {
                let Some(camera) = cameras.get(index) else { continue };
                let status = status.unwrap_or_else(|| camera.status());
                let mut notices = Vec::new();
                if !status.available {
                    notices.push(messages::camera_unavailable(&status));
                }
                current[index] = status;
                notices.push(messages::capabilities(&current));
                (notices, primary.clone())
            }
        };
        // Before any channel is open there is nowhere to answer (cannot
        // happen for replies: a request comes with its channel).
        let Some(target) = target else { continue };
        for mut message in outgoing {
            session.sign(&mut message);
            if let Err(e) = target.send_text(message.to_json()).await {
                tracing::debug!(session = %session.id(), label = target.label(), error = %e, "data channel send failed");
                break;
            }
        }
    }
}

#[cfg(test)]
#[path = "peer_tests.rs"]
mod tests;
