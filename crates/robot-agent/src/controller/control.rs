//! Who holds the robot's control: one controller across transports.
//!
//! A teleop session (a WebRTC session with the `operator` or `owner` role)
//! takes control when its offer is accepted; an ARP connection with such a
//! role takes it at `arp.initialize`. While one side holds control the
//! other is refused (`robot_busy`), and the controller refuses motion from
//! anyone but a holder. Teleop sessions do not exclude each other here: the
//! server's control lock already allows one operator per robot, and an
//! owner's session may overlap its predecessor's teardown. An `arp` data
//! channel belongs to its session: it may take control when its own session
//! is the only teleop holder.
//!
//! The lock is owned by the controller ([`super::ControllerHandle`]); this
//! type is only its state.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Who asks for control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimant {
    /// A WebRTC session, by id.
    Teleop(String),
    /// An ARP connection, by key, and the WebRTC session it rides on (an
    /// `arp` data channel), if any.
    Arp {
        key: String,
        session: Option<String>,
    },
}

/// Someone else holds control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("another controller holds the robot")]
pub struct Busy;

#[derive(Debug, Default)]
struct Holders {
    teleop: BTreeSet<String>,
    /// The ARP connection holding control: its key and its session.
    arp: Option<(String, Option<String>)>,
}

/// The control lock; clones share it.
#[derive(Debug, Clone, Default)]
pub struct ControlLock(Arc<Mutex<Holders>>);

impl ControlLock {
    fn holders(&self) -> MutexGuard<'_, Holders> {
        // Every change is one insert or remove: nothing half-done.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes control for `who` (again, if it holds it already).
    pub fn take(&self, who: &Claimant) -> Result<(), Busy> {
        let mut h = self.holders();
        match who {
            Claimant::Teleop(session) => {
                if let Some((_, arp_session)) = &h.arp {
                    if arp_session.as_deref() != Some(session.as_str()) {
                        return Err(Busy);
                    }
                }
                h.teleop.insert(session.clone());
            }
            Claimant::Arp { key, session } => {
                if h.arp.as_ref().is_some_and(|(holder, _)| holder != key) {
                    return Err(Busy);
                }
                let only_own_session = h.teleop.iter().all(|s| Some(s) == session.as_ref());
                if !only_own_session {
                    return Err(Busy);
                }
                h.arp = Some((key.clone(), session.clone()));
            }
        }
        Ok(())
    }

    /// `key` (a session id or an ARP connection's key) gives control back;
    /// nothing happens if it held none.
    pub fn release(&self, key: &str) {
        let mut h = self.holders();
        h.teleop.remove(key);
        if h.arp.as_ref().is_some_and(|(holder, _)| holder == key) {
            h.arp = None;
        }
    }

    /// Whether motion from `key` may go on: control is free, or `key`
    /// holds it.
    pub fn admits(&self, key: &str) -> bool {
        let h = self.holders();
        let free = h.teleop.is_empty() && h.arp.is_none();
        free || h.teleop.contains(key) || h.arp.as_ref().is_some_and(|(holder, _)| holder == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arp(key: &str, session: Option<&str>) -> Claimant {
        Claimant::Arp {
            key: key.into(),
            session: session.map(str::to_owned),
        }
    }

    #[test]
    fn one_side_at_a_time_and_released_by_its_holder() {
        let lock = ControlLock::default();
        assert!(lock.admits("anyone"), "free");
        lock.take(&Claimant::Teleop("s1".into())).expect("free");
        assert_eq!(lock.take(&arp("local-1", None)), Err(Busy));
        assert!(lock.admits("s1"));
        assert!(!lock.admits("local-1"));
        // Teleop sessions are arbitrated by the server's lock.
        lock.take(&Claimant::Teleop("s2".into())).expect("teleop");
        lock.release("local-1");
        lock.release("s1");
        assert_eq!(lock.take(&arp("local-1", None)), Err(Busy), "s2 holds");
        lock.release("s2");
        lock.take(&arp("local-1", None)).expect("free again");
        lock.take(&arp("local-1", None))
            .expect("again, same holder");
        assert_eq!(lock.take(&arp("local-2", None)), Err(Busy));
        assert_eq!(lock.take(&Claimant::Teleop("s3".into())), Err(Busy));
        assert!(lock.admits("local-1"));
        assert!(!lock.admits("s3"));
        lock.release("local-1");
        lock.take(&Claimant::Teleop("s3".into()))
            .expect("free again");
    }

    #[test]
    fn an_arp_channel_shares_its_own_sessions_control() {
        let lock = ControlLock::default();
        lock.take(&Claimant::Teleop("s1".into())).expect("free");
        lock.take(&arp("s1/arp", Some("s1")))
            .expect("its own session");
        assert_eq!(lock.take(&arp("s2/arp", Some("s2"))), Err(Busy));
        assert_eq!(lock.take(&Claimant::Teleop("s2".into())), Err(Busy));
        assert!(lock.admits("s1") && lock.admits("s1/arp"));
        lock.release("s1/arp");
        lock.release("s1");
        assert!(lock.admits("s2"), "free");
    }
}
