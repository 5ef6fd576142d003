//! The freshness filter against the situations it exists for: skewed
//! clocks, jitter, a released backlog after an outage, clock steps, an
//! unordered channel, and the timestamp-less legacy form. Time is explicit:
//! every arrival names its agent time in ms from the test's origin.

use super::*;

/// An arbitrary client wall-clock reading at the test's origin.
const CLIENT_EPOCH: i64 = 1_767_000_000_000;

fn cfg() -> FreshnessConfig {
    FreshnessConfig {
        window: Duration::from_millis(300),
        future_tolerance: Duration::from_millis(500),
        clock_window: Duration::from_secs(10),
    }
}

/// One session's gate driven by a script of arrivals; records what ran.
struct Run {
    cfg: FreshnessConfig,
    gate: MotionGate<u32>,
    t0: Instant,
    /// (command, agent ms when it was executed)
    executed: Vec<(u32, u64)>,
    dropped: Vec<(u32, Stale)>,
}

impl Run {
    fn new() -> Run {
        let t0 = Instant::now();
        Run {
            cfg: cfg(),
            gate: MotionGate::new(t0),
            t0,
            executed: Vec::new(),
            dropped: Vec::new(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn record(&mut self, decision: Decision<u32>, at: Instant) {
        match decision {
            Decision::Execute(id) => {
                let ms = u64::try_from(at.duration_since(self.t0).as_millis()).expect("ms");
                self.executed.push((id, ms));
            }
            Decision::Drop(id, why) => self.dropped.push((id, why)),
            Decision::Hold => {}
        }
    }

    /// Lets agent time pass to `ms`, ending bursts whose time has come
    /// exactly at their deadline (as the session task's timer does).
    fn advance(&mut self, ms: u64) {
        let until = self.at(ms);
        while let Some(deadline) = self.gate.deadline().filter(|d| *d <= until) {
            if let Some(decision) = self.gate.poll(&self.cfg, deadline) {
                self.record(decision, deadline);
            }
        }
    }

    /// Command `id` stamped `stamp` (client Unix ms, `None`: legacy) arrives
    /// at agent time `at_ms`.
    fn arrive(&mut self, at_ms: u64, stamp: Option<i64>, id: u32) {
        self.advance(at_ms);
        let now = self.at(at_ms);
        let outcome = self.gate.movement(&self.cfg, now, stamp, id);
        if let Some(old) = outcome.superseded {
            self.dropped.push((old, Stale::Superseded));
        }
        self.record(outcome.decision, now);
    }

    fn ran(&self, id: u32) -> bool {
        self.executed.iter().any(|(i, _)| *i == id)
    }

    fn executed_ids(&self) -> Vec<u32> {
        self.executed.iter().map(|(i, _)| *i).collect()
    }
}

/// A client whose clock reads `skew_ms` ahead of true time, sending at true
/// time `send_ms`.
fn stamp(send_ms: u64, skew_ms: i64) -> Option<i64> {
    Some(CLIENT_EPOCH + i64::try_from(send_ms).expect("ms") + skew_ms)
}

#[test]
fn skewed_clocks_do_not_matter_only_delay_does() {
    for skew in [0, 3_600_000, -3_600_000, 123_456_789, -987_654] {
        let mut run = Run::new();
        // 10 Hz for 3 s, 20 ms one-way delay.
        for i in 0..30u32 {
            let send = u64::from(i) * 100;
            run.arrive(send + 20, stamp(send, skew), i);
        }
        run.advance(5_000);
        assert_eq!(
            run.executed_ids(),
            (0..30).collect::<Vec<_>>(),
            "skew {skew}"
        );
        assert!(run.dropped.is_empty(), "skew {skew}: {:?}", run.dropped);
        // The first command waits for its burst to settle, then runs.
        assert_eq!(run.executed[0].1, 20 + 20);
        assert_eq!(run.executed[1].1, 120);
    }
}

#[test]
fn jitter_within_the_window_is_fresh() {
    let mut run = Run::new();
    // Deterministic jitter: delays between 5 and 180 ms, on an ordered
    // channel (a late message holds back the ones behind it).
    let delays = [5u64, 120, 40, 180, 10, 90, 170, 15, 60, 150];
    let mut arrival = 0;
    for i in 0..100u32 {
        let send = u64::from(i) * 100;
        let delay = delays[usize::try_from(i).expect("small") % delays.len()];
        arrival = (send + delay).max(arrival);
        run.arrive(arrival, stamp(send, 77), i);
    }
    run.advance(20_000);
    assert_eq!(run.executed.len(), 100, "dropped {:?}", run.dropped);
}

#[test]
fn delay_beyond_the_window_is_stale() {
    let mut run = Run::new();
    for i in 0..10u32 {
        let send = u64::from(i) * 100;
        run.arrive(send + 10, stamp(send, 0), i);
    }
    // Sent at 1000, arrives 350 ms late: 340 ms above the 10 ms baseline.
    run.arrive(1_350, stamp(1_000, 0), 10);
    assert_eq!(
        run.dropped.last(),
        Some(&(10, Stale::Late { excess_ms: 340 }))
    );
    // 290 ms above: still fresh.
    run.arrive(1_400, stamp(1_100, 0), 11);
    assert!(run.ran(11));
}

/// The scenario of issue 16: "forward" held at 10 Hz, the link down for
/// 5 s, every command sent meanwhile queued and delivered at once when the
/// link returns (here 1 s after, as SCTP retransmission backs off), then
/// fresh commands again.
#[test]
fn backlog_released_after_an_outage_never_runs() {
    for outage_ms in [1_000u64, 5_000, 30_000] {
        let mut run = Run::new();
        let delay = 15;
        for i in 0..20u32 {
            let send = u64::from(i) * 100;
            run.arrive(send + delay, stamp(send, -42_000), i);
        }
        // Link down from 2000 to 2000 + outage; commands keep being sent.
        let down = 2_000;
        let up = down + outage_ms;
        let release = up + 1_000;
        let queued: Vec<u32> = (20..)
            .take(usize::try_from((release - down) / 100).expect("n"))
            .collect();
        for (k, id) in queued.iter().enumerate() {
            let send = down + 100 * u64::try_from(k).expect("k");
            // Delivered back to back, 1 ms apart, in order.
            run.arrive(
                release + u64::try_from(k).expect("k") / 4,
                stamp(send, -42_000),
                *id,
            );
        }
        let last_queued = *queued.last().expect("some");
        // Queued behind the retransmissions are commands sent after the
        // link returned; the few sent within the window of the release may
        // run (the newest of the burst, if fresh), none sent earlier.
        let sent_before_up: Vec<u32> = queued
            .iter()
            .enumerate()
            .filter(|(k, _)| down + 100 * u64::try_from(*k).expect("k") < up)
            .map(|(_, id)| *id)
            .collect();
        assert!(!sent_before_up.is_empty());
        // Fresh commands after the backlog.
        let fresh_first = last_queued + 1;
        for j in 0..10u32 {
            let send = release + 100 + u64::from(j) * 100;
            run.arrive(send + delay, stamp(send, -42_000), fresh_first + j);
        }
        run.advance(release + 5_000);

        for id in &sent_before_up {
            assert!(!run.ran(*id), "outage {outage_ms}: queued command {id} ran");
        }
        // Of the whole backlog at most its newest ran, and only because it
        // was sent within the window of its delivery.
        let ran_queued: Vec<u32> = queued.iter().copied().filter(|id| run.ran(*id)).collect();
        assert!(
            ran_queued.is_empty() || ran_queued == vec![last_queued],
            "{ran_queued:?}"
        );
        assert!(
            run.ran(fresh_first),
            "outage {outage_ms}: fresh motion resumes at once"
        );
        assert!((fresh_first..fresh_first + 10).all(|id| run.ran(id)));
        assert_eq!(
            run.dropped.len() + ran_queued.len(),
            queued.len(),
            "outage {outage_ms}: {:?}",
            run.dropped
        );
    }
}

#[test]
fn burst_after_silence_runs_only_its_newest_and_only_if_fresh() {
    let mut run = Run::new();
    for i in 0..10u32 {
        let send = u64::from(i) * 100;
        run.arrive(send + 10, stamp(send, 0), i);
    }
    // 400 ms silence (a stall), then three commands at once: sent at 1200,
    // 1250 and 1300, all within the window of their delivery at 1310.
    run.arrive(1_310, stamp(1_200, 0), 10);
    run.arrive(1_310, stamp(1_250, 0), 11);
    run.arrive(1_311, stamp(1_300, 0), 12);
    run.advance(2_000);
    assert!(!run.ran(10) && !run.ran(11));
    assert_eq!(run.executed.last(), Some(&(12, 1_311 + 20)));
    assert!(run.dropped.contains(&(10, Stale::Superseded)));
    assert!(run.dropped.contains(&(11, Stale::Superseded)));

    // A burst whose newest is itself stale: nothing runs.
    let mut run = Run::new();
    for i in 0..10u32 {
        let send = u64::from(i) * 100;
        run.arrive(send + 10, stamp(send, 0), i);
    }
    run.arrive(3_000, stamp(1_000, 0), 10);
    run.arrive(3_000, stamp(1_100, 0), 11);
    run.advance(4_000);
    assert_eq!(run.executed.len(), 10);
}

#[test]
fn a_held_command_that_ages_out_while_settling_is_dropped() {
    let mut gate: MotionGate<u32> = MotionGate::new(Instant::now());
    let t0 = Instant::now();
    let c = FreshnessConfig {
        window: Duration::from_millis(300),
        ..cfg()
    };
    // Baseline from an earlier message (e.g. a ping) with 0 ms lag offset.
    gate.observe(&c, t0, stamp(0, 0).map(|s| s - 1));
    // A movement 290 ms old arrives after silence and is held...
    let at = t0 + Duration::from_millis(1_000);
    let out = gate.movement(&c, at, stamp(710, 0).map(|s| s - 1), 1);
    assert_eq!(out.decision, Decision::Hold);
    // ...and by the time it could run it is 310 ms old.
    let late = at + Duration::from_millis(20);
    assert_eq!(gate.poll(&c, late), Some(Decision::Drop(1, Stale::Expired)));
    assert_eq!(gate.deadline(), None);
}

#[test]
fn backward_clock_step_refuses_until_the_new_offset_held_a_whole_window() {
    let mut run = Run::new();
    for i in 0..50u32 {
        let send = u64::from(i) * 100;
        run.arrive(send + 10, stamp(send, 0), i);
    }
    // The client's clock steps back 2 s at true time 5000: every command
    // now looks 2 s late.
    for i in 50..250u32 {
        let send = u64::from(i) * 100;
        run.arrive(send + 10, stamp(send, -2_000), i);
    }
    run.advance(30_000);
    let first_after = run
        .executed
        .iter()
        .map(|(id, _)| *id)
        .find(|id| *id >= 50)
        .expect("motion comes back");
    // Refused for the clock window (10 s = 100 commands), then adopted.
    assert!((150..=152).contains(&first_after), "{first_after}");
    assert!((first_after..250).all(|id| run.ran(id)));
    assert!(run
        .dropped
        .iter()
        .all(|(id, why)| *id < first_after && matches!(why, Stale::Late { .. })));
}

#[test]
fn forward_clock_step_is_future_beyond_the_tolerance_and_fine_within_it() {
    // Within the tolerance: the baseline simply moves down.
    let mut run = Run::new();
    for i in 0..20u32 {
        let send = u64::from(i) * 100;
        let skew = if i < 10 { 0 } else { 400 };
        run.arrive(send + 10, stamp(send, skew), i);
    }
    run.advance(5_000);
    assert_eq!(run.executed.len(), 20, "{:?}", run.dropped);

    // Beyond it: refused as from the future until the step has held.
    let mut run = Run::new();
    for i in 0..150u32 {
        let send = u64::from(i) * 100;
        let skew = if i < 10 { 0 } else { 60_000 };
        run.arrive(send + 10, stamp(send, skew), i);
    }
    run.advance(20_000);
    assert!(matches!(
        run.dropped.first(),
        Some((10, Stale::Future { ahead_ms: 60_000 }))
    ));
    assert!(!run.ran(10) && run.ran(149));
}

#[test]
fn one_forged_future_timestamp_does_not_move_the_baseline() {
    let c = cfg();
    let t0 = Instant::now();
    let mut clock = ClockEstimator::new(t0);
    for i in 0..10u64 {
        let v = clock.judge(
            &c,
            t0 + Duration::from_millis(i * 100 + 10),
            stamp(i * 100, 0),
        );
        assert!(matches!(v, Verdict::Fresh { .. }), "{v:?}");
    }
    let baseline = clock.baseline();
    let v = clock.judge(
        &c,
        t0 + Duration::from_millis(1_010),
        stamp(1_000 + 86_400_000, 0),
    );
    assert_eq!(
        v,
        Verdict::Stale(Stale::Future {
            ahead_ms: 86_400_000
        })
    );
    assert_eq!(clock.baseline(), baseline);
    let v = clock.judge(&c, t0 + Duration::from_millis(1_110), stamp(1_100, 0));
    assert_eq!(v, Verdict::Fresh { age_ms: 0 });
}

#[test]
fn missing_timestamp_is_stale_for_non_movement_messages() {
    let mut gate: MotionGate<u32> = MotionGate::new(Instant::now());
    assert_eq!(
        gate.observe(&cfg(), Instant::now(), None),
        Verdict::Stale(Stale::NoTimestamp)
    );
}

#[test]
fn baseline_survives_a_silence_longer_than_the_clock_window() {
    let c = cfg();
    let t0 = Instant::now();
    let mut clock = ClockEstimator::new(t0);
    clock.judge(&c, t0 + Duration::from_millis(10), stamp(0, 5));
    // A minute of nothing, then a command sent 2 s before it arrives.
    let v = clock.judge(&c, t0 + Duration::from_millis(60_010), stamp(58_000, 5));
    assert_eq!(v, Verdict::Stale(Stale::Late { excess_ms: 2_000 }));
}

#[test]
fn reordered_older_command_on_an_unordered_channel_is_dropped() {
    let mut run = Run::new();
    for i in 0..5u32 {
        let send = u64::from(i) * 100;
        run.arrive(send + 10, stamp(send, 0), i);
    }
    // Sent at 500 and 600, but 600 overtakes 500.
    run.arrive(610, stamp(600, 0), 6);
    run.arrive(640, stamp(500, 0), 5);
    run.advance(1_000);
    assert!(run.ran(6));
    assert_eq!(run.dropped, vec![(5, Stale::OutOfOrder)]);
}

#[test]
fn legacy_commands_start_only_on_a_steady_stream() {
    let mut run = Run::new();
    // A live operator at 10 Hz: the third command runs, then all of them.
    for i in 0..10u32 {
        run.arrive(u64::from(i) * 100, None, i);
    }
    assert_eq!(run.executed_ids(), (2..10).collect::<Vec<_>>());
    assert_eq!(
        run.dropped,
        vec![(0, Stale::NotSteady), (1, Stale::NotSteady)]
    );
}

#[test]
fn legacy_backlog_after_an_outage_never_runs() {
    let mut run = Run::new();
    for i in 0..20u32 {
        run.arrive(u64::from(i) * 100, None, i);
    }
    // 5 s outage; 60 queued commands released in three clumps (as SCTP
    // retransmission rounds would), 50 ms apart, each clump back to back.
    let release = 1_900 + 5_000 + 1_000;
    let mut id = 20;
    for clump in 0..3u64 {
        for k in 0..20u64 {
            run.arrive(release + clump * 50 + k / 5, None, id);
            id += 1;
        }
    }
    let last_queued = id - 1;
    // Then the live stream at 10 Hz.
    for j in 0..10u64 {
        run.arrive(release + 200 + j * 100, None, id);
        id += 1;
    }
    assert!(
        (20..=last_queued).all(|q| !run.ran(q)),
        "{:?}",
        run.executed
    );
    // Motion resumes on the second live command: the gap before the first
    // live one is the first steady gap, its gap the second.
    let first_live = last_queued + 1;
    assert!(!run.ran(first_live));
    assert!((first_live + 1..id).all(|q| run.ran(q)));
}

#[test]
fn legacy_flow_ends_with_a_silence() {
    let mut run = Run::new();
    for i in 0..5u32 {
        run.arrive(u64::from(i) * 100, None, i);
    }
    assert!(run.ran(4));
    // 400 ms gap: the watchdog has stopped the robot; start again.
    run.arrive(800, None, 5);
    run.arrive(900, None, 6);
    run.arrive(1_000, None, 7);
    assert!(!run.ran(5) && !run.ran(6) && run.ran(7));
}
