//! How many connections may be open at once, in all and from one source. Used twice: for
//! TCP connections as they are accepted (`lean_io`), before any byte is read, and for
//! WebSockets at the upgrade (`ws`), before any token work, so floods cost little to
//! refuse.
//!
//! A source is an IPv4 address, or an IPv6 /64: one host commonly holds a whole /64, so
//! counting exact IPv6 addresses would give it billions of allowances.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
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

/// The source `address` counts against: itself for IPv4 (also when written as an
/// IPv4-mapped IPv6 address), its /64 for IPv6.
pub fn source(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

/// One admitted connection; dropping it frees its place.
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
        let address = source(address);
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
    fn an_ipv6_slash_64_is_one_source() {
        let admission = Admission::new(0, 2);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:1:2:3".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _first = admission.admit(a).unwrap();
        let _second = admission.admit(b).unwrap();
        assert_eq!(admission.admit(a).err(), Some(AdmissionError::AddressFull));
        assert!(admission.admit(other).is_ok());
        // An IPv4 client written as IPv6 is the same source as itself.
        let v4: IpAddr = [192, 0, 2, 7].into();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(source(mapped), v4);
        let _v4 = admission.admit(v4).unwrap();
        let _mapped = admission.admit(mapped).unwrap();
        assert_eq!(admission.admit(v4).err(), Some(AdmissionError::AddressFull));
    }

    #[test]
    fn zero_means_no_limit() {
        let admission = Admission::new(0, 0);
        let a: IpAddr = [127, 0, 0, 1].into();
        let permits: Vec<Permit> = (0..1000).map(|_| admission.admit(a).unwrap()).collect();
        assert_eq!(permits.len(), 1000);
    }
}
