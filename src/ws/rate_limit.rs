use std::time::Instant;

/// Token bucket: `rate` messages per second sustained, `burst` at once.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    pub fn new(rate: u32, burst: u32, now: Instant) -> RateLimiter {
        let burst = f64::from(burst.max(1));
        RateLimiter {
            rate: f64::from(rate.max(1)),
            burst,
            tokens: burst,
            last: now,
        }
    }

    pub fn allow(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
}
