//! Ends the sessions whose client socket went away and did not come back within
//! `--session-resume-secs` (see `Sessions::detach`).

use std::time::Duration;

use super::StopSignal;
use crate::state::SharedState;

pub async fn expire(state: SharedState, window: Duration, mut stop: StopSignal) {
    // Checked a few times per window: a session ends at most a quarter window late.
    let every = (window / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.stopped() => return,
            _ = tick.tick() => state.sessions.expire_orphans().await,
        }
    }
}
