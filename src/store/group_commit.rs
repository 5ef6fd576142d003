//! Group commit for the frequent small writes: a robot's last login and the session records.
//!
//! SQLite allows one writer at a time and every commit is a WAL append, so under load the
//! writes queue here and one task commits as many as have piled up in one transaction.
//! Each caller still waits until its own write is committed: nothing is acknowledged that
//! is not in the database. PostgreSQL gets the same writes directly on its pool: it runs
//! them side by side and groups concurrent commits by itself.

use sqlx::AnyConnection;
use tokio::sync::{mpsc, oneshot};

use super::connections::Connections;
use super::StoreError;

/// One queued write. Times are taken when the write is asked for, not when it commits.
#[derive(Debug, Clone)]
pub(super) enum Write {
    /// A robot's login, recorded only if what it proved still stands (see
    /// [`super::Store::record_login`]).
    Login {
        robot_id: String,
        node: String,
        at: i64,
        /// The credential the login proved, as stored: (kind column, its value column,
        /// the value). The row must still hold exactly this.
        kind: String,
        column: &'static str,
        value: String,
        /// Revocation entries the login proved; none may be on the list.
        entries: Vec<String>,
    },
    StartSession {
        id: String,
        connection_id: String,
        robot_id: String,
        subject: String,
        role: String,
        node: String,
        at: i64,
    },
    SessionConnected {
        id: String,
        at: i64,
    },
    EndSession {
        id: String,
        reason: String,
        at: i64,
    },
}

impl Write {
    /// Runs the write; returns the rows it changed.
    async fn execute(&self, conn: &mut AnyConnection) -> Result<u64, sqlx::Error> {
        let login_sql;
        let query = match self {
            Write::Login {
                robot_id,
                node,
                at,
                kind,
                column,
                value,
                entries,
            } => {
                let not_revoked = if entries.is_empty() {
                    String::new()
                } else {
                    let placeholders: Vec<String> =
                        (0..entries.len()).map(|i| format!("${}", i + 6)).collect();
                    format!(
                        " AND NOT EXISTS (SELECT 1 FROM revoked_credentials \
                         WHERE fingerprint IN ({}))",
                        placeholders.join(", ")
                    )
                };
                login_sql = format!(
                    "UPDATE robots SET last_seen_at = $2, node = $3 WHERE robot_id = $1 \
                     AND credential_revoked = 0 AND credential_kind = $4 AND {column} = $5\
                     {not_revoked}"
                );
                let mut query = sqlx::query(&login_sql)
                    .bind(robot_id)
                    .bind(*at)
                    .bind(node)
                    .bind(kind)
                    .bind(value);
                for entry in entries {
                    query = query.bind(entry);
                }
                query
            }
            Write::StartSession {
                id,
                connection_id,
                robot_id,
                subject,
                role,
                node,
                at,
            } => sqlx::query(
                "INSERT INTO sessions (id, connection_id, robot_id, subject, role, node, \
                 started_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id)
            .bind(connection_id)
            .bind(robot_id)
            .bind(subject)
            .bind(role)
            .bind(node)
            .bind(*at),
            // The first `connected` counts; later ones keep the first time.
            Write::SessionConnected { id, at } => sqlx::query(
                "UPDATE sessions SET connected_at = $2 WHERE id = $1 AND connected_at IS NULL",
            )
            .bind(id)
            .bind(*at),
            Write::EndSession { id, reason, at } => sqlx::query(
                "UPDATE sessions SET ended_at = $2, end_reason = $3 \
                 WHERE id = $1 AND ended_at IS NULL",
            )
            .bind(id)
            .bind(*at)
            .bind(reason),
        };
        Ok(query.execute(conn).await?.rows_affected())
    }
}

/// A write and the caller waiting for its outcome.
pub(super) struct Pending {
    write: Write,
    done: oneshot::Sender<Result<u64, StoreError>>,
}

/// Most writes one transaction takes.
const BATCH: usize = 512;

/// Queued writes awaiting the writer task; bounded, so a burst waits instead of growing.
pub(super) const QUEUE: usize = 4096;

/// Where the store sends its frequent writes.
#[derive(Clone)]
pub(super) enum Writes {
    /// SQLite: through the group-commit task.
    Grouped(mpsc::Sender<Pending>),
    /// PostgreSQL: straight to the pool (`Connections::Pool`).
    Direct(Connections),
}

impl Writes {
    pub(super) fn grouped(writer: Connections) -> Writes {
        let (queue, pending) = mpsc::channel(QUEUE);
        tokio::spawn(run(writer, pending));
        Writes::Grouped(queue)
    }

    /// Returns once the write is committed, with the rows it changed.
    pub(super) async fn write(&self, write: Write) -> Result<u64, StoreError> {
        match self {
            Writes::Direct(writer) => {
                let changed = commit(writer, &[&write]).await?;
                Ok(changed.first().copied().unwrap_or(0))
            }
            Writes::Grouped(queue) => {
                let (done, committed) = oneshot::channel();
                let stopped = || StoreError::Background("database writer stopped".into());
                queue
                    .send(Pending { write, done })
                    .await
                    .map_err(|_| stopped())?;
                committed.await.map_err(|_| stopped())?
            }
        }
    }
}

/// Commits whatever has queued up, one transaction per batch. When a batch fails, its
/// writes are retried one by one, so a single bad write fails only its own caller.
async fn run(writer: Connections, mut queue: mpsc::Receiver<Pending>) {
    let mut batch = Vec::with_capacity(BATCH);
    while queue.recv_many(&mut batch, BATCH).await > 0 {
        let writes: Vec<&Write> = batch.iter().map(|p| &p.write).collect();
        let result = commit(&writer, &writes).await;
        match result {
            Ok(changed) => {
                for (pending, rows) in batch.drain(..).zip(changed) {
                    let _ = pending.done.send(Ok(rows));
                }
            }
            Err(e) if batch.len() == 1 => {
                if let Some(pending) = batch.pop() {
                    let _ = pending.done.send(Err(e.into()));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, writes = batch.len(), "batch failed; writing one by one");
                for pending in batch.drain(..) {
                    let result = commit(&writer, &[&pending.write]).await;
                    let rows = result.map(|changed| changed.first().copied().unwrap_or(0));
                    let _ = pending.done.send(rows.map_err(StoreError::from));
                }
            }
        }
    }
}

/// Commits the writes (several in one transaction); the rows each changed, in order.
async fn commit(writer: &Connections, writes: &[&Write]) -> Result<Vec<u64>, sqlx::Error> {
    let mut conn = writer.lend().await?;
    let result = commit_on(&mut conn, writes).await;
    conn.checked(result)
}

async fn commit_on(conn: &mut AnyConnection, writes: &[&Write]) -> Result<Vec<u64>, sqlx::Error> {
    use sqlx::Connection as _;
    if let [only] = writes {
        // A statement alone commits by itself: BEGIN and COMMIT would be two more round
        // trips to SQLite's worker thread, the most a write costs when nothing queues.
        return Ok(vec![only.execute(conn).await?]);
    }
    let mut tx = conn.begin().await?;
    let mut changed = Vec::new();
    for write in writes {
        changed.push(write.execute(&mut tx).await?);
    }
    tx.commit().await?;
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use tokio::sync::{mpsc, oneshot};

    use super::{run, Pending, Write, Writes};
    use crate::store::Store;

    fn start(id: &str) -> Write {
        Write::StartSession {
            id: id.into(),
            connection_id: "c".into(),
            robot_id: "r".into(),
            subject: "alice".into(),
            role: "operator".into(),
            node: "n".into(),
            at: 1,
        }
    }

    fn end(id: &str) -> Write {
        Write::EndSession {
            id: id.into(),
            reason: "closed".into(),
            at: 2,
        }
    }

    /// Writes that queue up together share one transaction; a write alone runs without
    /// one. Either way each caller hears its own outcome: the rows it changed, or its own
    /// error, never a neighbour's.
    #[tokio::test]
    async fn each_write_hears_its_own_outcome_in_a_batch_and_alone() {
        let (store, file) = Store::scratch("group-commit").await;
        let (queue, pending) = mpsc::channel(16);
        // Queued before the writer starts, so they make one batch.
        let mut outcomes = Vec::new();
        for write in [start("a"), start("a"), start("b")] {
            let (done, outcome) = oneshot::channel();
            queue.send(Pending { write, done }).await.expect("queued");
            outcomes.push(outcome);
        }
        tokio::spawn(run(store.writer.clone(), pending));
        let mut results = Vec::new();
        for outcome in outcomes {
            results.push(outcome.await.expect("answered"));
        }
        assert!(matches!(results[0], Ok(1)), "{:?}", results[0]);
        assert!(results[1].is_err(), "the id is taken");
        assert!(matches!(results[2], Ok(1)), "{:?}", results[2]);

        let writes = Writes::Grouped(queue);
        assert_eq!(writes.write(end("a")).await.expect("ended"), 1);
        assert_eq!(writes.write(end("a")).await.expect("ended once"), 0);
        assert!(writes.write(start("b")).await.is_err(), "the id is taken");
        assert_eq!(writes.write(end("b")).await.expect("ended"), 1);
        store.close().await;
        std::fs::remove_file(file).ok();
    }
}
