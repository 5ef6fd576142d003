//! Persistence: robots, client tokens, grants, session records, revocations, settings.
//!
//! One schema for SQLite and PostgreSQL through sqlx's `Any` driver, so every query here is
//! written once in the common dialect (`$N` placeholders, TEXT/BIGINT columns, times in unix
//! milliseconds).

mod audit;
mod confirmations;
mod connections;
mod grants;
mod group_commit;
mod late_ends;
mod revocations;
mod robots;
mod sessions;
mod settings;
mod tokens;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyArguments, AnyConnectOptions, AnyPoolOptions, AnyQueryResult, AnyRow};
use sqlx::query::{Query, QueryAs};
use sqlx::{Any, FromRow};

use connections::Connections;

pub use audit::{bounded, AuditLog, AuditQuery, AuditRecord, AuditWriter, MAX_PARAMS_BYTES};
pub use confirmations::{Confirmation, Decision};
pub use grants::{Grant, Role};
pub use robots::{Credential, NewRobot, RobotRecord};
pub use sessions::{SessionFilter, SessionRecord};
pub use tokens::ClientToken;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot create database directory {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("corrupt stored value in {0}")]
    Corrupt(&'static str),
    #[error("background write failed: {0}")]
    Background(String),
}

#[derive(Clone)]
pub struct Store {
    /// Reads: on SQLite a few connections of our own, on PostgreSQL the pool.
    readers: Connections,
    /// Writes. On SQLite a single connection: SQLite allows one writer at a time, and
    /// queueing writers here is far cheaper than SQLite's busy-wait sleeps between
    /// connections (see `connections`). On PostgreSQL the same pool as reads.
    writer: Connections,
    /// The frequent small writes: last login, session records (see `group_commit`).
    writes: group_commit::Writes,
    /// Session ends the database refused, written again until it takes them.
    late_ends: std::sync::Arc<late_ends::LateEnds>,
    is_sqlite: bool,
}

/// The default database: a SQLite file under ./data, created on first start.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://data/signalling.db";

/// SQLite connections reading at once (WAL: beside the writer, and one another).
const SQLITE_READERS: u32 = 8;

/// How long a read waits for a connection before it fails (as sqlx's pool waited).
/// Writes wait their turn without a bound: the group commit and the audit writer queue
/// behind one another there by design.
const READ_WAIT: Duration = Duration::from_secs(10);

impl Store {
    /// For unit tests: a store on a new SQLite file in the temp folder (a file, because each
    /// pooled connection to `sqlite::memory:` would be a database of its own), and its path.
    #[cfg(test)]
    pub(crate) async fn scratch(name: &str) -> (Store, std::path::PathBuf) {
        let file = std::env::temp_dir().join(format!("{name}-{}.db", uuid::Uuid::new_v4()));
        let store = Store::connect(&format!("sqlite://{}", file.display()))
            .await
            .expect("scratch store");
        (store, file)
    }

    /// Connects (creating a missing SQLite file and its folder) and runs the migrations.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let is_sqlite = url.starts_with("sqlite:");
        let url = if is_sqlite {
            prepare_sqlite_url(url)?
        } else {
            url.to_string()
        };
        let options = AnyConnectOptions::from_str(&url)?;
        let (readers, writer, writes) = if is_sqlite {
            let writer = Connections::sqlite(options.clone(), 1, None).await?;
            // Before anything else reads or writes.
            let mut conn = writer.lend().await?;
            let migrated = sqlx::migrate!("./migrations").run_direct(&mut *conn).await;
            conn.checked(migrated)?;
            let readers = Connections::sqlite(options, SQLITE_READERS, Some(READ_WAIT)).await?;
            let writes = group_commit::Writes::grouped(writer.clone());
            (readers, writer, writes)
        } else {
            let pool = AnyPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(options)
                .await?;
            sqlx::migrate!("./migrations").run(&pool).await?;
            let pool = Connections::Pool(pool);
            let writes = group_commit::Writes::Direct(pool.clone());
            (pool.clone(), pool, writes)
        };
        Ok(Store {
            readers,
            writer,
            writes,
            late_ends: Default::default(),
            is_sqlite,
        })
    }

    pub fn backend(&self) -> &'static str {
        if self.is_sqlite {
            "sqlite"
        } else {
            "postgres"
        }
    }

    /// A cheap round trip for readiness checks.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.read_one(sqlx::query_as::<_, (i32,)>("SELECT 1"))
            .await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.readers.close().await;
        self.writer.close().await;
    }

    /// Runs a query on a reading connection: its first row, if any.
    async fn read_optional<'q, O>(
        &self,
        query: QueryAs<'q, Any, O, AnyArguments<'q>>,
    ) -> Result<Option<O>, StoreError>
    where
        O: for<'r> FromRow<'r, AnyRow> + Send + Unpin,
    {
        let mut conn = self.readers.lend().await?;
        let row = query.fetch_optional(&mut *conn).await;
        Ok(conn.checked(row)?)
    }

    /// Runs a query on a reading connection: its one row (an error without one).
    async fn read_one<'q, O>(
        &self,
        query: QueryAs<'q, Any, O, AnyArguments<'q>>,
    ) -> Result<O, StoreError>
    where
        O: for<'r> FromRow<'r, AnyRow> + Send + Unpin,
    {
        let mut conn = self.readers.lend().await?;
        let row = query.fetch_one(&mut *conn).await;
        Ok(conn.checked(row)?)
    }

    /// Runs a query on a reading connection: every row.
    async fn read_all<'q, O>(
        &self,
        query: QueryAs<'q, Any, O, AnyArguments<'q>>,
    ) -> Result<Vec<O>, StoreError>
    where
        O: for<'r> FromRow<'r, AnyRow> + Send + Unpin,
    {
        let mut conn = self.readers.lend().await?;
        let rows = query.fetch_all(&mut *conn).await;
        Ok(conn.checked(rows)?)
    }

    /// Runs one write statement on the writing connection (`writer`).
    async fn execute_write<'q>(
        &self,
        query: Query<'q, Any, AnyArguments<'q>>,
    ) -> Result<AnyQueryResult, StoreError> {
        let mut conn = self.writer.lend().await?;
        let result = query.execute(&mut *conn).await;
        Ok(conn.checked(result)?)
    }
}

/// Adds `mode=rwc` (create if missing) and makes sure the parent folder exists.
fn prepare_sqlite_url(url: &str) -> Result<String, StoreError> {
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let in_memory = path == ":memory:" || query.is_some_and(|q| q.contains("mode=memory"));
    if in_memory {
        return Ok(url.to_string());
    }
    {
        if let Some(parent) = Path::new(path).parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                    path: parent.display().to_string(),
                    source,
                })?;
            }
        }
    }
    Ok(match query {
        Some(q) if q.contains("mode=") => url.to_string(),
        Some(_) => format!("{url}&mode=rwc"),
        None => format!("{url}?mode=rwc"),
    })
}

pub(crate) use crate::clock::now_ms;

#[cfg(test)]
mod tests {
    use super::prepare_sqlite_url;

    #[test]
    fn sqlite_urls_get_create_mode() {
        let dir = std::env::temp_dir().join(format!("store-url-{}", uuid::Uuid::new_v4()));
        let url = format!("sqlite://{}/x.db", dir.display());
        assert_eq!(prepare_sqlite_url(&url).unwrap(), format!("{url}?mode=rwc"));
        assert!(dir.is_dir());
        assert_eq!(
            prepare_sqlite_url("sqlite::memory:").unwrap(),
            "sqlite::memory:"
        );
        assert_eq!(
            prepare_sqlite_url("sqlite://a.db?mode=ro").unwrap(),
            "sqlite://a.db?mode=ro"
        );
        std::fs::remove_dir_all(dir).ok();
    }
}
