//! How many sockets may be open at once, in all and from one source address. Checked at
//! the upgrade, before any token work, so a flood of connections costs little to refuse.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    #[error("too many connections to this server")]
    ServerFull,
    #[error("too many connections from this address")]
    AddressFull,
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// The counters; cheap to clone (one shared table).
#[derive(Clone)]
pub struct Admission {
    /// 0: no limit.
    max_total: usize,
    max_per_address: usize,
    counts: Arc<Mutex<Counts>>,
}

/// One admitted socket; dropping it frees its place.
pub struct Permit {
    address: IpAddr,
    counts: Arc<Mutex<Counts>>,
}

impl Admission {
    pub fn new(max_total: usize, max_per_address: usize) -> Admission {
        Admission {
            max_total,
            max_per_address,
            counts: Arc::default(),
        }
    }

    pub fn admit(&self, address: IpAddr) -> Result<Permit, AdmissionError> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if self.max_total > 0 && counts.total >= self.max_total {
            return Err(AdmissionError::ServerFull);
        }
        let from_address = counts.by_address.get(&address).copied().unwrap_or(0);
        if self.max_per_address > 0 && from_address >= self.max_per_address {
            return Err(AdmissionError::AddressFull);
        }
        counts.total += 1;
        counts.by_address.insert(address, from_address + 1);
        Ok(Permit {
            address,
            counts: self.counts.clone(),
        })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                counts.by_address.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_in_all_and_per_address() {
        let admission = Admission::new(3, 2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let first = admission.admit(a).unwrap();
        let _second = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).err(), Some(AdmissionError::AddressFull));
        let _third = admission.admit(b).unwrap();
        assert_eq!(admission.admit(b).err(), Some(AdmissionError::ServerFull));
        drop(first);
        assert!(admission.admit(a).is_ok());
    }

    #[test]
    fn zero_means_no_limit() {
        let admission = Admission::new(0, 0);
        let a: IpAddr = [127, 0, 0, 1].into();
        let permits: Vec<Permit> = (0..1000).map(|_| admission.admit(a).unwrap()).collect();
        assert_eq!(permits.len(), 1000);
    }
}
