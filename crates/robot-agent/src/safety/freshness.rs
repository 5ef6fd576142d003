//! Freshness of motion commands: no stale command moves the robot.
//!
//! A reliable, ordered data channel delivers everything a browser queued
//! during a network outage once the link returns; executed, that backlog
//! drives the robot on commands seconds old with nobody holding the stick.
//! Clients cannot be changed, so each session's commands are judged here,
//! from what the agent can observe: the sender's envelope `timestamp` and
//! the agent's own (monotonic) receive time.
//!
//! * [`ClockEstimator`]: per session, `lag = receive time − sent time`
//!   (clock offset + one-way delay). Its minimum over a sliding window is
//!   the baseline, the NTP way: the least-delayed sample is the best view
//!   of the offset. A sample more than `window` above the baseline is late,
//!   one more than `future_tolerance` below it claims to come from the
//!   future. Stale samples never move the baseline, so a backlog cannot
//!   make itself look fresh; a baseline survives silence (silence says
//!   nothing about the offset). A real change of offset (a clock step, a
//!   slower route) is adopted only once a steady, consistent stream has
//!   shown it for a whole clock window.
//! * [`MotionGate`]: per session, decides each movement command. After a
//!   silence longer than `window`, arrivals are a burst until they pause
//!   for [`BURST_SETTLE`]; only the newest of the burst may run, and only
//!   if it is still fresh when the burst ends. Commands without a
//!   timestamp (the legacy `MovementCommand`) are judged by arrival pattern
//!   alone; see [`MotionGate::movement`].
//!
//! Pure state machines: every input, time included, is an argument.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// After a silence, arrivals closer together than this are one burst; the
/// newest is held this long to see whether a newer one follows.
pub const BURST_SETTLE: Duration = Duration::from_millis(20);
/// Legacy (timestamp-less) commands: arrivals closer than this are a
/// burst (a released backlog), not a live operator.
pub const LEGACY_MIN_GAP: Duration = Duration::from_millis(30);
/// Legacy commands resume motion after a silence only on the command that
/// completes this many consecutive steady gaps (each between
/// [`LEGACY_MIN_GAP`] and the window).
pub const LEGACY_STEADY_GAPS: u32 = 2;
/// Fewest stale samples that may re-baseline a session's clock.
const REBASE_MIN_SAMPLES: usize = 5;
/// Bound of the sample memories (a flood must not grow memory).
const MAX_SAMPLES: usize = 4096;

/// The freshness parameters, from the safety limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreshnessConfig {
    /// Most a command may lag the session's best observed lag (the
    /// dead-man window: a command older than that would already have been
    /// stopped by the watchdog had it come on time).
    pub window: Duration,
    /// How far below the baseline a lag may be before the command counts
    /// as sent from the future.
    pub future_tolerance: Duration,
    /// Span of the sliding minimum, and how long a changed offset must hold
    /// before it is adopted.
    pub clock_window: Duration,
}

/// Why a command was judged stale; `details.cause` of the `agent.error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// Lags the session's baseline by more than the window.
    Late { excess_ms: i64 },
    /// Sent later than the session's clock allows (beyond the tolerance).
    Future { ahead_ms: i64 },
    /// No usable timestamp.
    NoTimestamp,
    /// Older than a command already executed (an unordered channel).
    OutOfOrder,
    /// A newer command of the same burst followed it.
    Superseded,
    /// It aged beyond the window while its burst settled.
    Expired,
    /// Timestamp-less, after a silence, before the stream is steady again.
    NotSteady,
}

impl Stale {
    pub fn cause(self) -> &'static str {
        match self {
            Stale::Late { .. } => "late",
            Stale::Future { .. } => "future",
            Stale::NoTimestamp => "no_timestamp",
            Stale::OutOfOrder => "out_of_order",
            Stale::Superseded => "superseded",
            Stale::Expired => "expired",
            Stale::NotSteady => "not_steady",
        }
    }
}

/// The clock's judgement of one timestamped message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `age_ms`: how much it lags the baseline (≥ 0 once the baseline is
    /// known; the delay beyond the best seen).
    Fresh {
        age_ms: i64,
    },
    Stale(Stale),
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    lag: i64,
}

/// Per-session estimate of clock offset + one-way delay (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct ClockEstimator {
    /// Receive times are measured from here, so the agent's wall clock
    /// (which may step) plays no part.
    origin: Instant,
    /// Fresh samples within the clock window; their minimum is the baseline.
    window: VecDeque<Sample>,
    baseline: Option<i64>,
    /// Consecutive stale samples: evidence of a changed offset.
    candidates: VecDeque<Sample>,
}

impl ClockEstimator {
    pub fn new(origin: Instant) -> ClockEstimator {
        ClockEstimator {
            origin,
            window: VecDeque::new(),
            baseline: None,
            candidates: VecDeque::new(),
        }
    }

    /// The current minimum lag, in ms (receive clock − sender clock).
    pub fn baseline(&self) -> Option<i64> {
        self.baseline
    }

    /// Judges a message sent at `sent_ms` (sender's Unix milliseconds) and
    /// received at `now`, and learns from it.
    pub fn judge(&mut self, cfg: &FreshnessConfig, now: Instant, sent_ms: Option<i64>) -> Verdict {
        let Some(sent_ms) = sent_ms else {
            return Verdict::Stale(Stale::NoTimestamp);
        };
        let received_ms = millis(now.saturating_duration_since(self.origin));
        let lag = received_ms.saturating_sub(sent_ms);
        let sample = Sample { at: now, lag };

        // Slide the window; an empty window keeps the last baseline.
        while self
            .window
            .front()
            .is_some_and(|s| now.saturating_duration_since(s.at) > cfg.clock_window)
        {
            self.window.pop_front();
        }
        if let Some(min) = self.window.iter().map(|s| s.lag).min() {
            self.baseline = Some(min);
        }

        let Some(baseline) = self.baseline else {
            // The session's first timestamp: nothing to compare with, and
            // nothing can have been queued on a channel that just opened.
            self.accept(sample);
            return Verdict::Fresh { age_ms: 0 };
        };
        let excess = lag.saturating_sub(baseline);
        let verdict = if excess > millis(cfg.window) {
            Verdict::Stale(Stale::Late { excess_ms: excess })
        } else if excess < -millis(cfg.future_tolerance) {
            Verdict::Stale(Stale::Future { ahead_ms: -excess })
        } else {
            self.accept(sample);
            return Verdict::Fresh {
                age_ms: excess.max(0),
            };
        };
        self.reject(cfg, sample);
        verdict
    }

    fn accept(&mut self, sample: Sample) {
        self.candidates.clear();
        if self.window.len() >= MAX_SAMPLES {
            self.window.pop_front();
        }
        self.window.push_back(sample);
        self.baseline = Some(self.baseline.map_or(sample.lag, |b| b.min(sample.lag)));
    }

    /// A stale sample is kept as evidence; if stale samples have come
    /// steadily for a whole clock window with consistent lags (within the
    /// window of each other), the offset really changed: adopt it. A
    /// released backlog never qualifies: it arrives at once, and its lags
    /// spread over the outage.
    fn reject(&mut self, cfg: &FreshnessConfig, sample: Sample) {
        if self.candidates.len() >= MAX_SAMPLES {
            self.candidates.pop_front();
        }
        self.candidates.push_back(sample);
        let (Some(first), Some(last)) = (
            self.candidates.front().copied(),
            self.candidates.back().copied(),
        ) else {
            return;
        };
        if self.candidates.len() < REBASE_MIN_SAMPLES
            || last.at.saturating_duration_since(first.at) < cfg.clock_window
        {
            return;
        }
        let lags = self.candidates.iter().map(|s| s.lag);
        let (min, max) = lags.fold((i64::MAX, i64::MIN), |(lo, hi), l| (lo.min(l), hi.max(l)));
        if max.saturating_sub(min) <= millis(cfg.window) {
            tracing::warn!(
                old_ms = self.baseline.unwrap_or_default(),
                new_ms = min,
                "a session's clock offset changed and held for the clock window; adopting it"
            );
            self.window = std::mem::take(&mut self.candidates);
            self.baseline = Some(min);
        } else {
            // Inconsistent evidence: keep only the most recent clock window.
            while self
                .candidates
                .front()
                .is_some_and(|s| last.at.saturating_duration_since(s.at) > cfg.clock_window)
            {
                self.candidates.pop_front();
            }
        }
    }
}

/// What to do with a movement command.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<T> {
    /// Send it to the safety core and the driver now.
    Execute(T),
    /// Held until the burst settles ([`MotionGate::deadline`]).
    Hold,
    /// Refuse it as stale.
    Drop(T, Stale),
}

/// The gate's answer to one arriving command: possibly the fate of the
/// command it held before (always superseded by a newer arrival), and the
/// decision about this one.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome<T> {
    pub superseded: Option<T>,
    pub decision: Decision<T>,
}

#[derive(Debug, Clone)]
struct Pending<T> {
    command: T,
    arrived: Instant,
    age_ms: i64,
    sent_ms: i64,
}

#[derive(Debug, Clone)]
struct Burst<T> {
    until: Instant,
    pending: Option<Pending<T>>,
}

/// Per-session movement gate (see the module documentation). `T` is the
/// caller's command (velocities, message id).
#[derive(Debug, Clone)]
pub struct MotionGate<T> {
    clock: ClockEstimator,
    last_arrival: Option<Instant>,
    /// Sent time of the newest timestamped command executed.
    newest_sent: Option<i64>,
    burst: Option<Burst<T>>,
    /// Legacy: motion flows (commands keep coming within the window).
    legacy_flowing: bool,
    legacy_steady_gaps: u32,
}

impl<T> MotionGate<T> {
    pub fn new(origin: Instant) -> MotionGate<T> {
        MotionGate {
            clock: ClockEstimator::new(origin),
            last_arrival: None,
            newest_sent: None,
            burst: None,
            legacy_flowing: false,
            legacy_steady_gaps: 0,
        }
    }

    pub fn clock(&self) -> &ClockEstimator {
        &self.clock
    }

    /// Judges a non-movement message (navigation start, e-stop reset, and
    /// every other envelope, which all teach the clock estimator).
    pub fn observe(
        &mut self,
        cfg: &FreshnessConfig,
        now: Instant,
        sent_ms: Option<i64>,
    ) -> Verdict {
        self.clock.judge(cfg, now, sent_ms)
    }

    /// When [`MotionGate::poll`] must be called next.
    pub fn deadline(&self) -> Option<Instant> {
        self.burst
            .as_ref()
            .filter(|b| b.pending.is_some())
            .map(|b| b.until)
    }

    /// Ends a settled burst: its newest command runs if still fresh.
    pub fn poll(&mut self, cfg: &FreshnessConfig, now: Instant) -> Option<Decision<T>> {
        if self.burst.as_ref().is_none_or(|b| now < b.until) {
            return None;
        }
        let pending = self.burst.take()?.pending?;
        let waited = millis(now.saturating_duration_since(pending.arrived));
        if pending.age_ms.saturating_add(waited) > millis(cfg.window) {
            return Some(Decision::Drop(pending.command, Stale::Expired));
        }
        self.newest_sent = Some(pending.sent_ms);
        Some(Decision::Execute(pending.command))
    }

    /// Decides a movement command received at `now`, sent at `sent_ms`
    /// (sender's Unix ms) or without a timestamp (`None`, the legacy form).
    ///
    /// Timestamped: stale by the clock → dropped; older than one already
    /// executed → dropped; after a silence longer than the window, held as
    /// the burst's newest (see [`MotionGate::poll`]); otherwise executed.
    ///
    /// Timestamp-less (legacy): the first command after a silence longer
    /// than the window never runs; motion resumes on the command that
    /// completes [`LEGACY_STEADY_GAPS`] consecutive gaps each between
    /// [`LEGACY_MIN_GAP`] and the window. A released backlog arrives
    /// faster than that and so never resumes motion; the commands after it
    /// must show a live, paced stream first.
    pub fn movement(
        &mut self,
        cfg: &FreshnessConfig,
        now: Instant,
        sent_ms: Option<i64>,
        command: T,
    ) -> Outcome<T> {
        let gap = self
            .last_arrival
            .map(|at| now.saturating_duration_since(at));
        self.last_arrival = Some(now);
        let silence = gap.is_none_or(|g| g > cfg.window);
        // Whatever was held, this command is newer.
        let mut burst = self.burst.take();
        let superseded = burst
            .as_mut()
            .and_then(|b| b.pending.take())
            .map(|p| p.command);
        let in_burst = burst.as_ref().is_some_and(|b| now < b.until);
        let decision = match sent_ms {
            None => self.legacy(cfg, gap, command),
            Some(sent) => {
                let verdict = self.clock.judge(cfg, now, Some(sent));
                match verdict {
                    Verdict::Stale(why) => Decision::Drop(command, why),
                    Verdict::Fresh { .. } if self.newest_sent.is_some_and(|n| sent < n) => {
                        Decision::Drop(command, Stale::OutOfOrder)
                    }
                    Verdict::Fresh { age_ms } if silence || in_burst => {
                        // Held as the burst's newest until arrivals pause.
                        self.burst = Some(Burst {
                            until: now + BURST_SETTLE,
                            pending: Some(Pending {
                                command,
                                arrived: now,
                                age_ms,
                                sent_ms: sent,
                            }),
                        });
                        return Outcome {
                            superseded,
                            decision: Decision::Hold,
                        };
                    }
                    Verdict::Fresh { .. } => {
                        self.newest_sent = Some(sent);
                        Decision::Execute(command)
                    }
                }
            }
        };
        if (silence || in_burst) && sent_ms.is_some() {
            // A stale arrival still extends the burst it belongs to.
            self.burst = Some(Burst {
                until: now + BURST_SETTLE,
                pending: None,
            });
        }
        Outcome {
            superseded,
            decision,
        }
    }

    fn legacy(&mut self, cfg: &FreshnessConfig, gap: Option<Duration>, command: T) -> Decision<T> {
        match gap {
            Some(g) if g <= cfg.window && self.legacy_flowing => Decision::Execute(command),
            Some(g) if g <= cfg.window && g >= LEGACY_MIN_GAP => {
                self.legacy_steady_gaps += 1;
                if self.legacy_steady_gaps >= LEGACY_STEADY_GAPS {
                    self.legacy_flowing = true;
                    Decision::Execute(command)
                } else {
                    Decision::Drop(command, Stale::NotSteady)
                }
            }
            // A silence, or a burst: start counting again.
            _ => {
                self.legacy_flowing = false;
                self.legacy_steady_gaps = 0;
                Decision::Drop(command, Stale::NotSteady)
            }
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[path = "freshness_tests.rs"]
mod tests;
