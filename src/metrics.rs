//! Prometheus metrics, one registry per server instance (so tests in one process don't mix).

use std::sync::Arc;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The message types the relay forwards.
pub const RELAYED_TYPES: [&str; 5] = [
    "signalling.offer",
    "signalling.answer",
    "signalling.ice_candidate",
    "signalling.connected",
    "signalling.disconnected",
];

/// A relayed type's counter and latency histogram, looked up once at start: a label lookup
/// per message (hashing and comparing the label) showed up in relay profiles.
pub struct RelayMetrics {
    pub relayed: IntCounter,
    pub latency: Histogram,
}

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Open WebSocket connections by role: pending (not yet a robot or client), robot, client.
    pub connections: IntGaugeVec,
    pub robots_online: IntGauge,
    pub sessions_active: IntGauge,
    pub messages_relayed: IntCounterVec,
    /// Seconds from reading a frame to queueing it on the receiving socket.
    pub relay_latency: HistogramVec,
    /// PKI proofs by result (verified, or the failure reason).
    pub pki_results: IntCounterVec,
    /// `signalling.error` messages sent, by spec code.
    pub errors: IntCounterVec,
    /// Messages about a session that had just ended, from one of its ends, accepted
    /// silently (a late `disconnected` is an idempotent end), by type.
    pub late_messages: IntCounterVec,
    /// Sockets closed for earning too many errors or exceeding the rate limit.
    pub peers_cut_off: IntCounter,
    /// Logins and offers checked again because a cut of access overlapped their check
    /// (see `Presence::access_cuts`), by what was checked (robot, client, offer) and outcome
    /// (stands, cut).
    pub access_rechecks: IntCounterVec,
    /// Frames of gateway programs dropped unread by the robot, by reason:
    /// `unsolicited_answer` (an answer to no request of the robot this program was sent).
    pub arp_frames_dropped: IntCounterVec,
    /// Loaded CRLs past their nextUpdate (still enforced; the issuer owes a newer one).
    pub crl_stale: IntGauge,
    pub tickets: TicketMetrics,
    pub cluster: ClusterMetrics,
    pub audit: AuditMetrics,
    relay: Arc<[RelayMetrics]>,
}

/// Session tickets: renewals sent, ARP session keys, what robots refused.
#[derive(Clone)]
pub struct TicketMetrics {
    /// Session tickets renewed for live teleop sessions (`session.ticket`).
    pub renewals: IntCounter,
    /// ARP sessions whose robot answered the key exchange: their later tickets are MAC'd.
    pub session_keys: IntCounter,
    /// What robots refused or ended for a bad or lapsed session ticket, as they report
    /// it: `offer`, `arp` (a gateway frame), `expired` (a session whose ticket ran out).
    pub robot_refusals: IntCounterVec,
}

impl TicketMetrics {
    fn register(r: &Registrar) -> TicketMetrics {
        TicketMetrics {
            renewals: r.counter(
                "signalling_ticket_renewals_total",
                "Session tickets renewed for live teleop sessions",
            ),
            session_keys: r.counter(
                "signalling_ticket_session_keys_total",
                "ARP sessions whose robot answered the ticket key exchange (later tickets MAC'd, not signed)",
            ),
            robot_refusals: r.counters(
                "signalling_robot_ticket_refusals_total",
                "Offers, gateway ARP frames and sessions robots refused or ended for a bad or lapsed session ticket, as they report it",
                &["kind"],
            ),
        }
    }
}

/// The node's link to the others (multi-node).
#[derive(Clone)]
pub struct ClusterMetrics {
    /// 1 while this node's Redis link (commands and its subscription) works.
    pub up: IntGauge,
    /// Messages between nodes by direction (sent, received) and kind.
    pub messages: IntCounterVec,
    /// Messages to other nodes dropped: Redis unreachable or the outgoing queue full.
    pub dropped: IntCounter,
    /// Seconds from publishing a probe on the bus to receiving it back (Redis bus lag).
    pub bus_lag: Histogram,
    /// Other nodes found dead (their heartbeat lease expired).
    pub nodes_lost: IntCounter,
    /// Frames from other nodes dropped because their sender and receiver are not the two
    /// ends of the session they name here (a session id taken over on another node).
    pub frames_refused: IntCounter,
}

impl ClusterMetrics {
    fn register(r: &Registrar) -> ClusterMetrics {
        ClusterMetrics {
            up: r.gauge(
                "signalling_cluster_up",
                "1 while the node's Redis link works (multi-node only)",
            ),
            messages: r.counters(
                "signalling_cluster_messages_total",
                "Messages between nodes by direction and kind",
                &["direction", "kind"],
            ),
            dropped: r.counter(
                "signalling_cluster_dropped_total",
                "Messages to other nodes dropped (Redis unreachable or queue full)",
            ),
            bus_lag: r.histogram(
                "signalling_cluster_bus_lag_seconds",
                "Time from publishing a probe on the Redis bus to receiving it",
                vec![
                    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0,
                ],
            ),
            nodes_lost: r.counter(
                "signalling_cluster_nodes_lost_total",
                "Other nodes found dead (heartbeat lease expired)",
            ),
            frames_refused: r.counter(
                "signalling_cluster_frames_refused_total",
                "Frames from other nodes dropped: sender and receiver are not the ends of the session they name",
            ),
        }
    }
}

/// The audit log's hold on tool calls.
#[derive(Clone)]
pub struct AuditMetrics {
    /// Audit records the database could not take, waiting in the spill file (or, when
    /// that cannot be written either, in memory) to be loaded back; 0 when all is written.
    pub spilled: IntGauge,
    /// Tool calls refused because their request could not be put on record first.
    pub refused_calls: IntCounter,
}

impl AuditMetrics {
    fn register(r: &Registrar) -> AuditMetrics {
        AuditMetrics {
            spilled: r.gauge(
                "signalling_audit_spilled_records",
                "Audit records waiting outside the database (spill file or memory) to be loaded back",
            ),
            refused_calls: r.counter(
                "signalling_audit_refused_calls_total",
                "Tool calls refused because their request could not be committed to the audit log",
            ),
        }
    }
}

/// Makes each metric and registers it in one step: no metric can be made and forgotten.
struct Registrar {
    registry: Registry,
}

impl Registrar {
    fn register<M: prometheus::core::Collector + Clone + 'static>(&self, metric: M) -> M {
        self.registry
            .register(Box::new(metric.clone()))
            .expect("unique metric names");
        metric
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).expect("valid metric"))
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("valid metric"))
    }

    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.register(Histogram::with_opts(opts).expect("valid metric"))
    }

    fn histograms(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
        labels: &[&str],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.register(HistogramVec::new(opts, labels).expect("valid metric"))
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registrar {
            registry: Registry::new(),
        };
        let messages_relayed = r.counters(
            "signalling_messages_relayed_total",
            "Messages relayed by type",
            &["type"],
        );
        let relay_latency = r.histograms(
            "signalling_relay_latency_seconds",
            "Time from reading a message to queueing it for its receiver",
            vec![
                0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
                0.01, 0.025, 0.05, 0.1,
            ],
            &["type"],
        );
        let relay = RELAYED_TYPES
            .iter()
            .map(|kind| RelayMetrics {
                relayed: messages_relayed.with_label_values(&[*kind]),
                latency: relay_latency.with_label_values(&[*kind]),
            })
            .collect();
        Metrics {
            relay,
            connections: r.gauges(
                "signalling_connections",
                "Open WebSocket connections by role",
                &["role"],
            ),
            robots_online: r.gauge("signalling_robots_online", "Verified robots online"),
            sessions_active: r.gauge("signalling_sessions_active", "Sessions in progress"),
            messages_relayed,
            relay_latency,
            pki_results: r.counters(
                "signalling_pki_results_total",
                "Robot identity proofs by result",
                &["result"],
            ),
            errors: r.counters(
                "signalling_errors_total",
                "signalling.error messages sent by code",
                &["code"],
            ),
            late_messages: r.counters(
                "signalling_late_messages_total",
                "Messages about a just-ended session from one of its ends, accepted silently",
                &["type"],
            ),
            peers_cut_off: r.counter(
                "signalling_peers_cut_off_total",
                "Sockets closed for too many errors or messages over the rate limit",
            ),
            access_rechecks: r.counters(
                "signalling_access_rechecks_total",
                "Logins and offers checked again because a revocation or grant change overlapped their check",
                &["kind", "outcome"],
            ),
            arp_frames_dropped: r.counters(
                "signalling_arp_frames_dropped_total",
                "Frames of ARP gateway programs dropped before the robot, by reason",
                &["reason"],
            ),
            crl_stale: r.gauge("signalling_crl_stale", "Loaded CRLs past their nextUpdate"),
            tickets: TicketMetrics::register(&r),
            cluster: ClusterMetrics::register(&r),
            audit: AuditMetrics::register(&r),
            registry: r.registry,
        }
    }

    /// Counts a re-check of `kind` (robot, client, offer) and whether the access stood.
    pub fn access_rechecked(&self, kind: &str, stands: bool) {
        let outcome = if stands { "stands" } else { "cut" };
        self.access_rechecks
            .with_label_values(&[kind, outcome])
            .inc();
    }

    /// Counters of a relayed message type (`None` for types that are never relayed).
    pub fn relay(&self, kind: &str) -> Option<&RelayMetrics> {
        let index = RELAYED_TYPES.iter().position(|t| *t == kind)?;
        self.relay.get(index)
    }

    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = encoder.encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
