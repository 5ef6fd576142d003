//! Renews the session tickets of live teleop sessions, for robots that take renewals:
//! such a robot ends a session whose ticket runs out, so a session lasts only as long as
//! the server keeps vouching for it (a cut it never heard of, or a ticket captured on
//! the way, is worth at most one ticket's life).

use std::time::Duration;

use super::StopSignal;
use crate::state::SharedState;
use crate::tickets::TicketFor;

pub async fn renew(state: SharedState, every: Duration, mut stop: StopSignal) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the offers' own tickets are fresh.
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.stopped() => return,
            _ = tick.tick() => {
                let sent = state.sessions.renew_tickets(|session| {
                    state.tickets.offer(TicketFor {
                        robot: &session.robot_id,
                        connection_id: &session.session_id,
                        subject: &session.subject,
                        role: session.role,
                    })
                });
                state.metrics.tickets.renewals.inc_by(sent as u64);
            }
        }
    }
}
