//! The ping and the idle deadline every WebSocket of the server keeps, `/ws` and the ARP
//! gateway alike: a ping every `ping_every`, and a socket nothing was heard from for
//! `idle_timeout` (not even a pong) is taken for dead at the next one.

use std::time::Instant;

use crate::config::SocketLimits;

/// What is due when the ping's time comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Send a ping (the next one is scheduled).
    Ping,
    /// Nothing heard for the idle timeout: close the socket.
    Idle,
}

/// When the next ping is due.
#[derive(Debug)]
pub struct Heartbeat {
    next_ping: Instant,
}

impl Heartbeat {
    pub fn new(now: Instant, limits: &SocketLimits) -> Heartbeat {
        Heartbeat {
            next_ping: now + limits.ping_every,
        }
    }

    pub fn next_ping(&self) -> Instant {
        self.next_ping
    }

    /// At `now`, with the socket last heard at `last_heard`: nothing before the ping's time,
    /// then a ping or, for a socket silent past the idle timeout, its end.
    pub fn due(
        &mut self,
        now: Instant,
        last_heard: Instant,
        limits: &SocketLimits,
    ) -> Option<Beat> {
        if self.next_ping > now {
            return None;
        }
        self.next_ping = now + limits.ping_every;
        if now.saturating_duration_since(last_heard) > limits.idle_timeout {
            Some(Beat::Idle)
        } else {
            Some(Beat::Ping)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn pings_on_time_and_gives_up_on_a_silent_socket() {
        let config = crate::config::Config::from_args(["signalling-server"]).expect("config");
        let limits = config.socket_limits();
        let start = Instant::now();
        let mut beat = Heartbeat::new(start, limits);
        assert_eq!(beat.due(start, start, limits), None);
        let first = beat.next_ping();
        assert_eq!(beat.due(first, start, limits), Some(Beat::Ping));
        assert_eq!(beat.next_ping(), first + limits.ping_every);
        let late = start + limits.idle_timeout + limits.ping_every + Duration::from_secs(1);
        assert_eq!(beat.due(late, start, limits), Some(Beat::Idle));
        assert_eq!(
            beat.due(late + limits.ping_every, late, limits),
            Some(Beat::Ping)
        );
    }
}
