//! Navigation as the controller sees it: at most one goal at a time, owned
//! by the session that started it, with its lifecycle (`started` once, then
//! one of `completed`, `cancelled`, `failed`) reported to that session.
//!
//! The controller decides *whether* a goal may start (role, driver, safety
//! checks) and delivers the notices this type produces; this type owns the
//! goal's state and its conversation with the driver.

use std::time::Duration;

use signalling_protocol::{Envelope, Location, NavigationStatus};
use tokio::sync::{mpsc, oneshot};

use super::NavRefusal;
use crate::driver::{DriverCommand, DriverError, REQUEST_TIMEOUT};
use crate::messages;
use crate::safety::Refusal;

/// The driver's answer to a goal, tagged with the goal's id.
pub(super) type Accepted = (u64, Result<(), DriverError>);

/// A `navigation.response` for one session.
pub(super) struct Notice {
    pub session: String,
    pub envelope: Envelope,
}

struct Goal {
    id: u64,
    name: String,
    session: String,
    correlation: String,
    started_sent: bool,
}

impl Goal {
    fn notice(&self, status: NavigationStatus, message: Option<String>) -> Notice {
        Notice {
            session: self.session.clone(),
            envelope: messages::navigation_response(status, &self.name, message, &self.correlation),
        }
    }

    /// `started` goes out once, whichever of the driver's acceptance or
    /// its status report comes first.
    fn started(&mut self, message: Option<String>) -> Option<Notice> {
        if self.started_sent {
            return None;
        }
        self.started_sent = true;
        Some(self.notice(NavigationStatus::Started, message))
    }
}

pub(super) struct Navigation {
    goal: Option<Goal>,
    next_id: u64,
    accepted: mpsc::Sender<Accepted>,
}

impl Navigation {
    pub fn new(accepted: mpsc::Sender<Accepted>) -> Navigation {
        Navigation {
            goal: None,
            next_id: 1,
            accepted,
        }
    }

    /// Name of the goal in progress.
    pub fn active(&self) -> Option<&str> {
        self.goal.as_ref().map(|g| g.name.as_str())
    }

    pub fn owned_by(&self, session: &str) -> bool {
        self.goal.as_ref().is_some_and(|g| g.session == session)
    }

    /// Refuses a second goal while one is in progress.
    pub fn check_idle(&self) -> Result<(), NavRefusal> {
        match &self.goal {
            Some(goal) => Err(NavRefusal::AlreadyActive(goal.name.clone())),
            None => Ok(()),
        }
    }

    /// Sends the goal to the driver; its acceptance arrives later through
    /// the `accepted` channel (see [`Navigation::accepted`]).
    pub fn start(
        &mut self,
        driver: &mpsc::Sender<DriverCommand>,
        session: String,
        correlation: String,
        location: Location,
    ) -> Result<(), NavRefusal> {
        self.check_idle()?;
        let id = self.next_id;
        self.next_id += 1;
        let (reply, answer) = oneshot::channel();
        driver
            .try_send(DriverCommand::Navigate {
                name: location.name.clone(),
                position: location.position,
                orientation: location.orientation,
                reply,
            })
            .map_err(|_| NavRefusal::Refused(Refusal::DriverBusy))?;
        self.goal = Some(Goal {
            id,
            name: location.name,
            session,
            correlation,
            started_sent: false,
        });
        let accepted = self.accepted.clone();
        tokio::spawn(async move {
            let result = match tokio::time::timeout(
                REQUEST_TIMEOUT + Duration::from_secs(1),
                answer,
            )
            .await
            {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(DriverError::Unavailable),
                Err(_) => Err(DriverError::Timeout),
            };
            let _ = accepted.send((id, result)).await;
        });
        Ok(())
    }

    /// Ends the goal in progress (if any) with `status`; the notice for its
    /// session.
    pub fn finish(&mut self, status: NavigationStatus, message: Option<String>) -> Option<Notice> {
        self.goal.take().map(|g| g.notice(status, message))
    }

    /// Cancels the goal in progress: the driver is asked to cancel; returns
    /// the goal's name, the notice, and whether the cancel could be queued
    /// (if not, the caller must stop the robot instead).
    pub fn cancel(
        &mut self,
        driver: &mpsc::Sender<DriverCommand>,
    ) -> Result<(String, Notice, bool), NavRefusal> {
        let goal = self.goal.take().ok_or(NavRefusal::NotActive)?;
        let (reply, answer) = oneshot::channel();
        let queued = driver
            .try_send(DriverCommand::CancelNavigation { reply })
            .is_ok();
        if queued {
            tokio::spawn(async move {
                if let Ok(Ok(Err(e))) = tokio::time::timeout(REQUEST_TIMEOUT, answer).await {
                    tracing::warn!(error = %e, "driver refused to cancel navigation");
                }
            });
        }
        let notice = goal.notice(NavigationStatus::Cancelled, None);
        Ok((goal.name, notice, queued))
    }

    /// Manual control takes over: the goal is cancelled (the driver told,
    /// without waiting for its answer).
    pub fn preempt(&mut self, driver: &mpsc::Sender<DriverCommand>) -> Option<Notice> {
        let notice = self.finish(
            NavigationStatus::Cancelled,
            Some("preempted by manual control".into()),
        )?;
        let (reply, _) = oneshot::channel();
        let _ = driver.try_send(DriverCommand::CancelNavigation { reply });
        Some(notice)
    }

    /// The driver's answer to goal `id` (ignored if that goal is gone).
    pub fn accepted(&mut self, id: u64, result: Result<(), DriverError>) -> Option<Notice> {
        let goal = self.goal.as_mut().filter(|g| g.id == id)?;
        match result {
            Ok(()) => goal.started(None),
            Err(e) => self.finish(NavigationStatus::Failed, Some(e.to_string())),
        }
    }

    /// A status report from the driver about goal `name`.
    pub fn driver_status(
        &mut self,
        name: &str,
        status: NavigationStatus,
        message: Option<String>,
    ) -> Option<Notice> {
        let Some(goal) = self.goal.as_mut().filter(|g| g.name == name) else {
            tracing::debug!(%name, ?status, "navigation status for no active navigation");
            return None;
        };
        if status == NavigationStatus::Started {
            return goal.started(message);
        }
        self.finish(status, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::validated;
    use signalling_protocol::Position;

    fn location(name: &str) -> Location {
        Location {
            name: name.into(),
            position: Position {
                x: 1.0,
                y: 2.0,
                z: None,
            },
            orientation: None,
            metadata: None,
        }
    }

    fn status_of(notice: &Notice) -> String {
        let v = validated(&notice.envelope);
        v["payload"]["status"].as_str().expect("status").to_owned()
    }

    #[tokio::test]
    async fn one_goal_at_a_time_started_once_then_finished() {
        let (accepted_tx, _accepted_rx) = mpsc::channel(4);
        let (driver, mut commands) = mpsc::channel(4);
        let mut nav = Navigation::new(accepted_tx);
        nav.start(&driver, "s1".into(), "req-1".into(), location("dock"))
            .expect("starts");
        assert!(matches!(
            commands.try_recv(),
            Ok(DriverCommand::Navigate { name, .. }) if name == "dock"
        ));
        assert_eq!(nav.active(), Some("dock"));
        assert!(nav.owned_by("s1") && !nav.owned_by("s2"));
        assert_eq!(
            nav.start(&driver, "s2".into(), "req-2".into(), location("desk")),
            Err(NavRefusal::AlreadyActive("dock".into()))
        );
        // An answer for an older goal id changes nothing.
        assert!(nav.accepted(99, Ok(())).is_none());
        let started = nav.accepted(1, Ok(())).expect("started");
        assert_eq!(
            (started.session.as_str(), status_of(&started).as_str()),
            ("s1", "started")
        );
        assert_eq!(validated(&started.envelope)["correlationId"], "req-1");
        // The driver's own "started" report does not repeat it.
        assert!(nav
            .driver_status("dock", NavigationStatus::Started, None)
            .is_none());
        assert!(nav
            .driver_status("elsewhere", NavigationStatus::Completed, None)
            .is_none());
        let done = nav
            .driver_status("dock", NavigationStatus::Completed, None)
            .expect("completed");
        assert_eq!(status_of(&done), "completed");
        assert_eq!(nav.active(), None);
        assert!(matches!(nav.cancel(&driver), Err(NavRefusal::NotActive)));
    }

    #[tokio::test]
    async fn cancel_reports_whether_the_driver_could_be_told() {
        let (accepted_tx, _accepted_rx) = mpsc::channel(4);
        let (driver, mut commands) = mpsc::channel(1);
        let mut nav = Navigation::new(accepted_tx);
        nav.start(&driver, "s1".into(), "req-1".into(), location("dock"))
            .expect("starts");
        // The goal fills the driver's queue: the cancel cannot be queued,
        // so the caller must stop the robot instead.
        let (name, notice, queued) = nav.cancel(&driver).expect("cancelled");
        assert_eq!((name.as_str(), queued), ("dock", false));
        assert_eq!(status_of(&notice), "cancelled");
        assert!(matches!(
            commands.try_recv(),
            Ok(DriverCommand::Navigate { .. })
        ));

        nav.start(&driver, "s1".into(), "req-2".into(), location("desk"))
            .expect("starts");
        commands.try_recv().expect("goal");
        let preempted = nav.preempt(&driver).expect("preempted");
        assert_eq!(status_of(&preempted), "cancelled");
        assert!(matches!(
            commands.try_recv(),
            Ok(DriverCommand::CancelNavigation { .. })
        ));
        let failed = nav.finish(NavigationStatus::Failed, Some("x".into()));
        assert!(failed.is_none(), "nothing left to fail");
    }
}
