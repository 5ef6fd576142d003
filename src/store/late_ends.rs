//! Session ends the database did not take when they happened (it was down, or locked past
//! its timeout): kept in order and written again until it takes them, each with the time and
//! reason of the real end. A record is then closed late rather than never, and the node's
//! `server_shutdown` sweep at its stop does not stand in for the reason it had (issue 42:
//! no record lost while PostgreSQL is away).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use super::group_commit::Write;
use super::Store;
use crate::shutdown::StopSignal;

/// The most ends kept. Past it the oldest is dropped (logged): its record is closed by the
/// node's sweep at its next stop or start, with that sweep's reason.
const MAX_KEPT: usize = 100_000;

/// The pause between attempts while the database still refuses.
const RETRY_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct LateEnds {
    kept: Mutex<VecDeque<Write>>,
    added: Notify,
}

impl LateEnds {
    pub(super) fn keep(&self, write: Write) {
        let dropped = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            let dropped = if kept.len() >= MAX_KEPT {
                kept.pop_front()
            } else {
                None
            };
            kept.push_back(write);
            dropped
        };
        if let Some(Write::EndSession { id, .. }) = dropped {
            tracing::error!(
                session_record = %id,
                "{MAX_KEPT} session ends wait for the database: the oldest is dropped (the \
                 node's sweep at its next stop or start closes it)"
            );
        }
        self.added.notify_one();
    }

    /// Everything kept, taken out: two callers never write the same end.
    fn take(&self) -> VecDeque<Write> {
        std::mem::take(&mut *self.kept.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Puts back what was taken and not written, ahead of anything kept since.
    fn put_back(&self, unwritten: VecDeque<Write>) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        for write in unwritten.into_iter().rev() {
            kept.push_front(write);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Store {
    /// Writes the kept session ends, oldest first, until the database refuses one. Returns
    /// how many are still kept.
    pub async fn write_late_ends(&self) -> usize {
        let mut pending = self.late_ends.take();
        if pending.is_empty() {
            return self.late_ends.len();
        }
        let mut written = 0usize;
        while let Some(write) = pending.pop_front() {
            if let Err(e) = self.writes.write(write.clone()).await {
                tracing::debug!(error = %e, "session ends still refused by the database");
                pending.push_front(write);
                break;
            }
            written += 1;
        }
        self.late_ends.put_back(pending);
        let left = self.late_ends.len();
        if written > 0 {
            tracing::info!(written, left, "session ends written late");
        }
        left
    }

    /// Background: writes the kept ends as soon as there are some, again every second while
    /// the database refuses them.
    pub async fn retry_late_ends(self, mut stop: StopSignal) {
        loop {
            tokio::select! {
                _ = stop.stopped() => return,
                _ = self.late_ends.added.notified() => {}
            }
            while self.write_late_ends().await > 0 {
                tokio::select! {
                    _ = stop.stopped() => return,
                    _ = tokio::time::sleep(RETRY_EVERY) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::store::{SessionFilter, SessionRecord, Store};

    async fn record(store: &Store, robot: &str) -> SessionRecord {
        let filter = SessionFilter {
            robot_id: Some(robot.to_string()),
            limit: 10,
            ..SessionFilter::default()
        };
        let mut records = store.sessions(&filter).await.expect("sessions");
        assert_eq!(records.len(), 1, "{records:?}");
        records.remove(0)
    }

    /// The sessions table away (renamed from outside), so every write to it fails at once.
    async fn table_away(store: &Store, away: bool) {
        let sql = if away {
            "ALTER TABLE sessions RENAME TO sessions_away"
        } else {
            "ALTER TABLE sessions_away RENAME TO sessions"
        };
        store.execute_write(sqlx::query(sql)).await.expect("rename");
    }

    #[tokio::test]
    async fn a_session_end_the_database_refused_is_written_once_it_takes_it() {
        let dir = std::env::temp_dir().join(format!("late-ends-{}", uuid::Uuid::new_v4()));
        let store = Store::connect(&format!("sqlite://{}/s.db", dir.display()))
            .await
            .expect("store");
        for robot in ["r1", "r2"] {
            store
                .start_session(&format!("id-{robot}"), "c", robot, "alice", "operator", "n")
                .await
                .expect("start");
        }

        table_away(&store, true).await;
        let before = crate::clock::now_ms();
        assert!(store.end_session("id-r1", "closed").await.is_err());
        assert!(store.end_session("id-r2", "grant_revoked").await.is_err());
        assert_eq!(store.late_ends.len(), 2);
        assert_eq!(store.write_late_ends().await, 2, "still refused: kept");
        table_away(&store, false).await;

        assert_eq!(store.write_late_ends().await, 0);
        for (robot, reason) in [("r1", "closed"), ("r2", "grant_revoked")] {
            let record = record(&store, robot).await;
            assert_eq!(record.end_reason.as_deref(), Some(reason));
            let ended = record.ended_at.expect("ended");
            assert!(
                ended >= before && ended <= before + 5_000,
                "the end's own time"
            );
        }
        store.close().await;
        std::fs::remove_dir_all(dir).ok();
    }
}
