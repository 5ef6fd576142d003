//! Group commit for the frequent small writes: a robot's last login and the session records.
//!
//! SQLite allows one writer at a time and every commit is a WAL append, so under load the
//! writes queue here and one task commits as many as have piled up in one transaction.
//! Each caller still waits until its own write is committed: nothing is acknowledged that
//! is not in the database. PostgreSQL gets the same writes directly on its pool: it runs
//! them side by side and groups concurrent commits by itself.

use sqlx::{AnyConnection, AnyPool};
use tokio::sync::{mpsc, oneshot};

use super::StoreError;

/// One queued write. Times are taken when the write is asked for, not when it commits.
#[derive(Debug)]
pub(super) enum Write {
    Touch {
        robot_id: String,
        node: String,
        at: i64,
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
    async fn execute(&self, conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
        let query = match self {
            Write::Touch { robot_id, node, at } => {
                sqlx::query("UPDATE robots SET last_seen_at = $2, node = $3 WHERE robot_id = $1")
                    .bind(robot_id)
                    .bind(*at)
                    .bind(node)
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
        query.execute(conn).await?;
        Ok(())
    }
}

/// A write and the caller waiting for its outcome.
pub(super) struct Pending {
    write: Write,
    done: oneshot::Sender<Result<(), StoreError>>,
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
    /// PostgreSQL: straight to the pool.
    Direct(AnyPool),
}

impl Writes {
    pub(super) fn grouped(writer: AnyPool) -> Writes {
        let (queue, pending) = mpsc::channel(QUEUE);
        tokio::spawn(run(writer, pending));
        Writes::Grouped(queue)
    }

    /// Returns once the write is committed.
    pub(super) async fn write(&self, write: Write) -> Result<(), StoreError> {
        match self {
            Writes::Direct(pool) => {
                let mut conn = pool.acquire().await?;
                write.execute(&mut conn).await?;
                Ok(())
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
async fn run(writer: AnyPool, mut queue: mpsc::Receiver<Pending>) {
    let mut batch = Vec::with_capacity(BATCH);
    while queue.recv_many(&mut batch, BATCH).await > 0 {
        let result = commit(&writer, batch.iter().map(|p| &p.write)).await;
        match result {
            Ok(()) => {
                for pending in batch.drain(..) {
                    let _ = pending.done.send(Ok(()));
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
                    let result = commit(&writer, std::iter::once(&pending.write)).await;
                    let _ = pending.done.send(result.map_err(StoreError::from));
                }
            }
        }
    }
}

async fn commit<'a>(
    writer: &AnyPool,
    writes: impl Iterator<Item = &'a Write>,
) -> Result<(), sqlx::Error> {
    let mut tx = writer.begin().await?;
    for write in writes {
        write.execute(&mut tx).await?;
    }
    tx.commit().await
}
