//! A message budget (token bucket) over one peer's frames: the data channel's session loop
//! and each ARP connection use one, so a flooding peer is answered, not served.

use tokio::time::Instant;

/// `rate` messages per second sustained, `burst` at once.
#[derive(Debug)]
pub struct MessageBudget {
    rate: f64,
    burst: f64,
    left: f64,
    at: Option<Instant>,
}

impl MessageBudget {
    pub fn new(rate: f64, burst: f64) -> MessageBudget {
        MessageBudget {
            rate,
            burst,
            left: burst,
            at: None,
        }
    }

    /// Takes one message from the budget; false when it is spent.
    pub fn take(&mut self) -> bool {
        let now = Instant::now();
        if let Some(at) = self.at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * self.rate;
            self.left = (self.left + refill).min(self.burst);
        }
        self.at = Some(now);
        if self.left >= 1.0 {
            self.left -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate() {
        let mut budget = MessageBudget::new(10.0, 3.0);
        assert!((0..3).all(|_| budget.take()));
        assert!(!budget.take());
        tokio::time::advance(std::time::Duration::from_millis(100)).await;
        assert!(budget.take());
        assert!(!budget.take());
    }
}
