//! Token buckets and strike windows: the arithmetic behind every limit on what a peer may
//! send. Time is an input, so every rule is testable without waiting.

use std::time::{Duration, Instant};

/// Token bucket: `rate` units per second sustained, `burst` at once.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    pub fn new(rate: u64, burst: u64, now: Instant) -> RateLimiter {
        let burst = burst.max(1) as f64;
        RateLimiter {
            rate: rate.max(1) as f64,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// One unit (a message).
    pub fn allow(&mut self, now: Instant) -> bool {
        self.allow_cost(now, 1)
    }

    /// `cost` units at once (e.g. bytes); refused whole if they do not fit. A cost above
    /// the burst is admitted when the bucket is full, so a single large message is never
    /// refused forever.
    pub fn allow_cost(&mut self, now: Instant, cost: usize) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        let cost = (cost as f64).min(self.burst);
        if self.tokens >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }
}

/// Counts misbehaviour (errors earned, messages over the rate limit) over a sliding window.
/// Unlike a counter reset by the next good message, a peer that alternates good and bad
/// messages forever still runs out of strikes. The limit and the window are the caller's:
/// they are the same for every socket, and this is kept in each (a plain `Vec`: a strike
/// list is short, and holds nothing until the first strike).
#[derive(Debug, Default)]
pub struct Strikes {
    at: Vec<Instant>,
}

impl Strikes {
    /// Records a strike; true when the peer has now had more than `max` (at least 1)
    /// within `window`.
    pub fn strike(&mut self, now: Instant, max: usize, window: Duration) -> bool {
        self.at
            .retain(|at| now.saturating_duration_since(*at) <= window);
        self.at.push(now);
        self.at.len() > max.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill() {
        let start = Instant::now();
        let mut limiter = RateLimiter::new(10, 3, start);
        assert!((0..3).all(|_| limiter.allow(start)));
        assert!(!limiter.allow(start));
        // 100 ms at 10/s refills one token.
        assert!(limiter.allow(start + Duration::from_millis(100)));
        assert!(!limiter.allow(start + Duration::from_millis(100)));
        // Never more than the burst, however long the pause.
        let later = start + Duration::from_secs(60);
        assert!((0..3).all(|_| limiter.allow(later)));
        assert!(!limiter.allow(later));
    }

    #[test]
    fn costs_are_bytes() {
        let start = Instant::now();
        let mut bytes = RateLimiter::new(1000, 1000, start);
        assert!(bytes.allow_cost(start, 600));
        assert!(!bytes.allow_cost(start, 600));
        assert!(bytes.allow_cost(start + Duration::from_millis(200), 600));
        // Larger than the burst: admitted only from a full bucket.
        let later = start + Duration::from_secs(5);
        assert!(bytes.allow_cost(later, 5000));
        assert!(!bytes.allow_cost(later, 5000));
    }

    #[test]
    fn strikes_are_not_forgiven_by_one_good_message() {
        let start = Instant::now();
        let mut strikes = Strikes::default();
        let window = Duration::from_secs(10);
        let mut strike = |at| strikes.strike(at, 3, window);
        // Alternating with allowed messages changes nothing: only time forgives.
        assert!(!strike(start));
        assert!(!strike(start + Duration::from_secs(1)));
        assert!(!strike(start + Duration::from_secs(2)));
        assert!(strike(start + Duration::from_secs(3)));
        // Long after, the window has emptied.
        let later = start + Duration::from_secs(30);
        assert!(!strike(later));
    }
}
