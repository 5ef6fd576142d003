//! The connection every write of this process goes through.
//!
//! SQLite lets one connection write at a time, so on SQLite there is exactly one writing
//! connection, lent to one writer at a time (an async mutex: writers queue in turn).
//! Not a pool of one, for two reasons:
//! - a pool pings each connection given back to it, and spawns a task to do it: one more
//!   round trip to SQLite's worker thread per write, the largest share of what a write
//!   cost once the statement itself was one round trip (docs/benchmarks.md, "Fewer hand-offs
//!   to SQLite").
//! - a write that fails or is abandoned half-way must not leave its connection to the next
//!   writer. When SQLite reports the disk full it may roll the transaction back by itself;
//!   the driver's account then disagrees with SQLite's, and every later commit on that
//!   connection was acknowledged while nothing reached the file (issue 42, fault 7). Here
//!   such a connection is dropped (SQLite rolls back what it left open) and the next write
//!   opens a fresh one.
//!
//! On PostgreSQL writes share the readers' pool (it runs them side by side); a failed write
//! closes its pooled connection for the same reason.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use sqlx::any::AnyConnectOptions;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Connection as _, Executor as _};
use tokio::sync::{Mutex, MutexGuard};

/// Where writes go.
#[derive(Clone)]
pub(super) enum Writer {
    /// SQLite: the one writing connection (`None` after a failed write, until the next).
    Sole(Arc<Sole>),
    /// PostgreSQL: the pool.
    Pool(AnyPool),
}

pub(super) struct Sole {
    connection: Mutex<Option<AnyConnection>>,
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

impl Writer {
    /// The SQLite writer, its connection opened now (so a database that cannot be written
    /// fails at start, not at the first login).
    pub(super) async fn sole(options: AnyConnectOptions) -> Result<Writer, sqlx::Error> {
        let conn = open(&options).await?;
        Ok(Writer::Sole(Arc::new(Sole {
            connection: Mutex::new(Some(conn)),
            options,
        })))
    }

    /// The connection, once the writers before have given it back.
    pub(super) async fn lend(&self) -> Result<WriteConn<'_>, sqlx::Error> {
        let lent = match self {
            Writer::Sole(sole) => {
                let mut slot = sole.connection.lock().await;
                if slot.is_none() {
                    *slot = Some(open(&sole.options).await?);
                }
                Lent::Sole(slot)
            }
            Writer::Pool(pool) => Lent::Pooled(pool.acquire().await?),
        };
        Ok(WriteConn {
            lent,
            succeeded: false,
        })
    }

    pub(super) async fn close(&self) {
        match self {
            Writer::Sole(sole) => {
                if let Some(conn) = sole.connection.lock().await.take() {
                    let _ = conn.close().await;
                }
            }
            Writer::Pool(pool) => pool.close().await,
        }
    }
}

/// The writing connection, lent until dropped. Unless [`WriteConn::checked`] saw the
/// write succeed, it is discarded then, not given to the next writer.
pub(crate) struct WriteConn<'a> {
    lent: Lent<'a>,
    succeeded: bool,
}

enum Lent<'a> {
    Sole(MutexGuard<'a, Option<AnyConnection>>),
    Pooled(PoolConnection<Any>),
}

impl WriteConn<'_> {
    /// Gives the connection back, to be kept if `result` is a success; passes `result` on.
    pub(super) fn checked<T, E>(mut self, result: Result<T, E>) -> Result<T, E> {
        self.succeeded = result.is_ok();
        result
    }
}

impl Deref for WriteConn<'_> {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        match &self.lent {
            // `lend` fills the slot before lending it, and only `drop` empties it.
            Lent::Sole(slot) => slot.as_ref().expect("a lent slot holds a connection"),
            Lent::Pooled(conn) => conn,
        }
    }
}

impl DerefMut for WriteConn<'_> {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match &mut self.lent {
            Lent::Sole(slot) => slot.as_mut().expect("a lent slot holds a connection"),
            Lent::Pooled(conn) => conn,
        }
    }
}

impl Drop for WriteConn<'_> {
    fn drop(&mut self) {
        if self.succeeded {
            return;
        }
        match &mut self.lent {
            // Dropped, it closes; SQLite rolls back whatever it left open.
            Lent::Sole(slot) => drop(slot.take()),
            Lent::Pooled(conn) => conn.close_on_drop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;

    /// Whether the writing connection is the one that made the temp table (temp tables
    /// belong to their connection).
    async fn same_connection(store: &Store) -> bool {
        let mut conn = store.writer.lend().await.expect("lent");
        let seen = sqlx::query("SELECT 1 FROM temp.marker")
            .execute(&mut *conn)
            .await;
        conn.checked(Ok::<_, sqlx::Error>(())).expect("kept");
        seen.is_ok()
    }

    async fn mark(store: &Store) {
        let mut conn = store.writer.lend().await.expect("lent");
        let made = sqlx::query("CREATE TEMP TABLE marker (x INTEGER)")
            .execute(&mut *conn)
            .await;
        conn.checked(made).expect("marked");
    }

    /// A write that succeeds keeps the connection for the next; one that fails, or is
    /// abandoned before it is checked, leaves a fresh connection to the next writer.
    #[tokio::test]
    async fn only_a_connection_whose_write_succeeded_is_lent_again() {
        let (store, file) = Store::scratch("writer").await;
        mark(&store).await;
        assert!(same_connection(&store).await, "kept after a success");

        let mut conn = store.writer.lend().await.expect("lent");
        let failed = sqlx::query("INSERT INTO no_such_table VALUES (1)")
            .execute(&mut *conn)
            .await;
        assert!(conn.checked(failed).is_err());
        assert!(!same_connection(&store).await, "discarded after a failure");

        mark(&store).await;
        assert!(same_connection(&store).await);
        let abandoned = store.writer.lend().await.expect("lent");
        drop(abandoned);
        assert!(!same_connection(&store).await, "discarded when abandoned");

        // The fresh connection writes.
        store
            .put_grant("r", "alice", crate::store::Role::Operator)
            .await
            .expect("written");
        store.close().await;
        std::fs::remove_file(file).ok();
    }
}
