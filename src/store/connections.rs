//! The connections statements run on, lent to one caller at a time.
//!
//! On SQLite the store keeps its own connections instead of sqlx's pool: one for every
//! write of this process and a few for reads. Two reasons:
//! - a pool pings each connection given back to it, and spawns a task to do it: one more
//!   round trip to SQLite's worker thread per statement, as much as the statement itself
//!   when it is a small read or write (docs/benchmarks.md, "Fewer hand-offs to SQLite" for
//!   writes, "Reads without the pool's ping" for reads).
//! - a statement that fails or is abandoned half-way must not leave its connection to the
//!   next caller. When SQLite reports the disk full it may roll the transaction back by
//!   itself; the driver's account then disagrees with SQLite's, and every later commit on
//!   that connection was acknowledged while nothing reached the file (issue 42, fault 7).
//!   Here such a connection is dropped (SQLite rolls back what it left open) and the next
//!   caller gets a fresh one.
//!
//! SQLite lets one connection write at a time, so writes have exactly one connection
//! (callers queue for it in turn); reads have several, each read on one of them (WAL lets
//! them run beside the writer). On PostgreSQL reads and writes share sqlx's pool (it runs
//! them side by side, and its connections, which die with the server, are worth the
//! ping); a failed statement closes its pooled connection for the same reason.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sqlx::any::AnyConnectOptions;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Connection as _, Executor as _};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Where statements go.
#[derive(Clone)]
pub(super) enum Connections {
    /// SQLite: connections of our own, at most `Kept::limit` lent at once.
    Kept(Arc<Kept>),
    /// PostgreSQL: the pool.
    Pool(AnyPool),
}

pub(super) struct Kept {
    /// Connections not lent now. Fewer than the limit after a failed statement (dropped)
    /// until a caller opens a fresh one.
    idle: Mutex<Vec<AnyConnection>>,
    /// One permit per connection that may be lent; callers wait here in turn.
    permits: Semaphore,
    limit: u32,
    /// How long a caller waits for a permit before the statement fails; `None`: as long as
    /// it takes.
    wait: Option<Duration>,
    options: AnyConnectOptions,
}

/// Settings every SQLite connection gets, the writer's and the readers'.
pub(super) async fn sqlite_settings(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    // WAL lets readers run beside the writer; busy_timeout covers the rare overlap with
    // another process.
    conn.execute("PRAGMA journal_mode = WAL").await?;
    conn.execute("PRAGMA busy_timeout = 5000").await?;
    conn.execute("PRAGMA synchronous = NORMAL").await?;
    Ok(())
}

async fn open(options: &AnyConnectOptions) -> Result<AnyConnection, sqlx::Error> {
    let mut conn = AnyConnection::connect_with(options).await?;
    sqlite_settings(&mut conn).await?;
    Ok(conn)
}

impl Connections {
    /// `limit` SQLite connections, the first opened now (so a database that cannot be
    /// opened fails at start, not at the first login), the others when first needed. A
    /// caller waits `wait` at most for one (`sqlx::Error::PoolTimedOut` then).
    pub(super) async fn sqlite(
        options: AnyConnectOptions,
        limit: u32,
        wait: Option<Duration>,
    ) -> Result<Connections, sqlx::Error> {
        let first = open(&options).await?;
        Ok(Connections::Kept(Arc::new(Kept {
            idle: Mutex::new(vec![first]),
            permits: Semaphore::new(limit as usize),
            limit,
            wait,
            options,
        })))
    }

    /// A connection, once one is free.
    pub(super) async fn lend(&self) -> Result<Lent<'_>, sqlx::Error> {
        let connection = match self {
            Connections::Kept(kept) => {
                let acquire = kept.permits.acquire();
                let permit = match kept.wait {
                    Some(wait) => tokio::time::timeout(wait, acquire)
                        .await
                        .map_err(|_| sqlx::Error::PoolTimedOut)?,
                    None => acquire.await,
                }
                .map_err(|_| sqlx::Error::PoolClosed)?;
                let idle = kept.idle().pop();
                let conn = match idle {
                    Some(conn) => conn,
                    None => open(&kept.options).await?,
                };
                Connection::Kept {
                    kept,
                    conn: Some(conn),
                    _permit: permit,
                }
            }
            Connections::Pool(pool) => Connection::Pooled(pool.acquire().await?),
        };
        Ok(Lent {
            connection,
            succeeded: false,
        })
    }

    /// Closes every connection once given back; nothing is lent afterwards.
    pub(super) async fn close(&self) {
        match self {
            Connections::Kept(kept) => {
                let Ok(all) = kept.permits.acquire_many(kept.limit).await else {
                    return;
                };
                kept.permits.close();
                drop(all);
                let idle = std::mem::take(&mut *kept.idle());
                for conn in idle {
                    let _ = conn.close().await;
                }
            }
            Connections::Pool(pool) => pool.close().await,
        }
    }
}

impl Kept {
    fn idle(&self) -> MutexGuard<'_, Vec<AnyConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection, lent until dropped. Unless [`Lent::checked`] saw its statement succeed,
/// it is discarded then, not given to the next caller.
pub(crate) struct Lent<'a> {
    connection: Connection<'a>,
    succeeded: bool,
}

enum Connection<'a> {
    Kept {
        kept: &'a Kept,
        /// `Some` until given back or discarded (in `drop`).
        conn: Option<AnyConnection>,
        /// Released after the connection is back in `idle` (fields drop after `drop`).
        _permit: SemaphorePermit<'a>,
    },
    Pooled(PoolConnection<Any>),
}

impl Lent<'_> {
    /// Gives the connection back, to be kept if `result` is a success; passes `result` on.
    pub(super) fn checked<T, E>(mut self, result: Result<T, E>) -> Result<T, E> {
        self.succeeded = result.is_ok();
        result
    }
}

impl Deref for Lent<'_> {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        match &self.connection {
            // `lend` fills it, and only `drop` empties it.
            Connection::Kept { conn, .. } => conn.as_ref().expect("a lent connection"),
            Connection::Pooled(conn) => conn,
        }
    }
}

impl DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match &mut self.connection {
            Connection::Kept { conn, .. } => conn.as_mut().expect("a lent connection"),
            Connection::Pooled(conn) => conn,
        }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        match &mut self.connection {
            Connection::Kept { kept, conn, .. } => {
                let conn = conn.take();
                if self.succeeded {
                    if let Some(conn) = conn {
                        kept.idle().push(conn);
                    }
                }
                // Otherwise dropped, it closes; SQLite rolls back whatever it left open.
            }
            Connection::Pooled(conn) => {
                if !self.succeeded {
                    conn.close_on_drop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt as _;

    use super::Connections;
    use crate::store::{Role, Store};

    /// Whether the connection lent next is the one that made the temp table (temp tables
    /// belong to their connection; an idle connection is lent again last in, first out).
    async fn same_connection(connections: &Connections) -> bool {
        let mut conn = connections.lend().await.expect("lent");
        let seen = sqlx::query("SELECT 1 FROM temp.marker")
            .execute(&mut *conn)
            .await;
        conn.checked(Ok::<_, sqlx::Error>(())).expect("kept");
        seen.is_ok()
    }

    async fn mark(connections: &Connections) {
        let mut conn = connections.lend().await.expect("lent");
        let made = sqlx::query("CREATE TEMP TABLE marker (x INTEGER)")
            .execute(&mut *conn)
            .await;
        conn.checked(made).expect("marked");
    }

    /// A statement that succeeds keeps its connection for the next caller; one that fails,
    /// or is abandoned before it is checked, leaves a fresh connection to the next. For the
    /// writer and for the readers alike.
    #[tokio::test]
    async fn only_a_connection_whose_statement_succeeded_is_lent_again() {
        let (store, file) = Store::scratch("connections").await;
        for (name, connections) in [("writer", &store.writer), ("readers", &store.readers)] {
            mark(connections).await;
            assert!(
                same_connection(connections).await,
                "{name}: kept after a success"
            );

            let mut conn = connections.lend().await.expect("lent");
            let failed = sqlx::query("SELECT * FROM no_such_table")
                .execute(&mut *conn)
                .await;
            assert!(conn.checked(failed).is_err());
            assert!(
                !same_connection(connections).await,
                "{name}: discarded after a failure"
            );

            mark(connections).await;
            assert!(same_connection(connections).await);
            let abandoned = connections.lend().await.expect("lent");
            drop(abandoned);
            assert!(
                !same_connection(connections).await,
                "{name}: discarded when abandoned"
            );
        }

        // The fresh connections write and read.
        store
            .put_grant("r", "alice", Role::Operator)
            .await
            .expect("written");
        assert_eq!(
            store.grant("r", "alice").await.expect("read"),
            Some(Role::Operator)
        );
        store.close().await;
        std::fs::remove_file(file).ok();
    }

    /// Readers run side by side, up to their number, and beside the writer: a read does
    /// not wait for a connection another read holds.
    #[tokio::test]
    async fn reads_run_beside_one_another() {
        let (store, file) = Store::scratch("readers").await;
        let mut held = Vec::new();
        for _ in 0..super::super::SQLITE_READERS {
            held.push(store.readers.lend().await.expect("lent"));
        }
        let writing = store.writer.lend().await.expect("the writer is apart");
        drop(writing);
        let waiting = store.readers.lend();
        tokio::pin!(waiting);
        assert!(
            waiting.as_mut().now_or_never().is_none(),
            "all readers are lent"
        );
        drop(held.pop());
        let freed = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("lent once one came back")
            .expect("lent");
        drop(freed);
        drop(held);
        store.close().await;
        std::fs::remove_file(file).ok();
    }

    /// A read waits for a connection a bounded time, as it did in sqlx's pool, and then
    /// fails instead of hanging.
    #[tokio::test]
    async fn a_read_waits_for_a_connection_only_so_long() {
        use std::str::FromStr as _;
        sqlx::any::install_default_drivers();
        let file = std::env::temp_dir().join(format!("wait-{}.db", uuid::Uuid::new_v4()));
        let options = sqlx::any::AnyConnectOptions::from_str(&format!(
            "sqlite://{}?mode=rwc",
            file.display()
        ))
        .expect("options");
        let wait = std::time::Duration::from_millis(50);
        let readers = Connections::sqlite(options, 1, Some(wait))
            .await
            .expect("opened");
        let held = readers.lend().await.expect("lent");
        let refused = tokio::time::timeout(std::time::Duration::from_secs(10), readers.lend())
            .await
            .expect("not waiting for ever");
        assert!(
            matches!(refused, Err(sqlx::Error::PoolTimedOut)),
            "{:?}",
            refused.err()
        );
        drop(held);
        let lent = readers.lend().await.expect("lent once given back");
        drop(lent);
        readers.close().await;
        std::fs::remove_file(file).ok();
    }
}
