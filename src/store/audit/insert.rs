//! The statements that append audit records (see [`super::Store::append_audit`]).

use std::collections::HashSet;
use std::fmt::Write;

use super::{AuditRecord, StoreError, BATCH};

/// The last of each id's records, in order (a batch may carry a record twice: a spill
/// loaded back beside the same records held in memory).
fn latest_per_id(records: &[AuditRecord]) -> Vec<&AuditRecord> {
    let mut seen = HashSet::with_capacity(records.len());
    let mut latest: Vec<&AuditRecord> = records
        .iter()
        .rev()
        .filter(|r| seen.insert(r.id.as_str()))
        .collect();
    latest.reverse();
    latest
}

/// How a statement's placeholders are written.
#[derive(Clone, Copy)]
pub(super) enum Placeholders {
    /// `$1, $2, ...`: PostgreSQL's.
    Numbered,
    /// `?, ?, ...`, bound in order: SQLite looks a numbered placeholder's name up by a
    /// walk through all of them, for each one bound; for a batch of 8 records (120 values)
    /// that cost a tool call some 7,000 instructions (issue 44).
    Anonymous,
}

/// `INSERT INTO audit_log (...) VALUES ($1, ..., $15), ($16, ...)` for `rows` records.
///
/// The text for a batch of up to [`CACHED_ROWS`] records is made once: at a low rate every
/// call is a batch of its own, and formatting 15 placeholders cost a tool call through the
/// gateway some 12,000 instructions (issue 44).
fn insert_rows(rows: usize, placeholders: Placeholders) -> std::borrow::Cow<'static, str> {
    static NUMBERED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    static ANONYMOUS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let cache = match placeholders {
        Placeholders::Numbered => &NUMBERED,
        Placeholders::Anonymous => &ANONYMOUS,
    };
    if (1..=CACHED_ROWS).contains(&rows) {
        let cached = cache.get_or_init(|| {
            (1..=CACHED_ROWS)
                .map(|rows| make_insert_rows(rows, placeholders))
                .collect()
        });
        return std::borrow::Cow::Borrowed(cached[rows - 1].as_str());
    }
    std::borrow::Cow::Owned(make_insert_rows(rows, placeholders))
}

/// Batches whose statement text [`insert_rows`] keeps.
pub(super) const CACHED_ROWS: usize = 8;

fn make_insert_rows(rows: usize, placeholders: Placeholders) -> String {
    const COLUMNS: usize = 15;
    let mut sql = String::from(
        "INSERT INTO audit_log (id, at, robot_id, subject, role, node, action, tool, params, \
         outcome, error_code, duration_ms, idempotency_key, confirmed_by, session_id) VALUES ",
    );
    for row in 0..rows {
        sql.push_str(if row == 0 { "(" } else { ", (" });
        for column in 0..COLUMNS {
            let separator = if column > 0 { ", " } else { "" };
            // Writing into a String cannot fail.
            let _ = match placeholders {
                Placeholders::Numbered => {
                    write!(sql, "{separator}${}", row * COLUMNS + column + 1)
                }
                Placeholders::Anonymous => write!(sql, "{separator}?"),
            };
        }
        sql.push(')');
    }
    sql.push_str(
        " ON CONFLICT (id) DO UPDATE SET outcome = excluded.outcome, \
         error_code = excluded.error_code, duration_ms = excluded.duration_ms, \
         confirmed_by = excluded.confirmed_by",
    );
    sql
}

/// [`Store::append_audit`] on one connection, all or nothing: one statement when the
/// records fit in one (a statement is atomic by itself, on both databases: no BEGIN and
/// COMMIT around it, two round trips to the database fewer per batch, issue 44), else one
/// transaction.
pub(super) async fn append_audit_on(
    conn: &mut sqlx::AnyConnection,
    records: &[AuditRecord],
    placeholders: Placeholders,
) -> Result<(), StoreError> {
    use sqlx::Connection as _;
    let latest = latest_per_id(records);
    let written = if latest.len() <= BATCH {
        insert(&mut *conn, &latest, placeholders).await
    } else {
        let mut tx = conn.begin().await?;
        for chunk in latest.chunks(BATCH) {
            insert(&mut tx, chunk, placeholders).await?;
        }
        tx.commit().await.map_err(StoreError::from)
    };
    // The connection's buffers keep the size of the largest message they carried: one
    // batch after a stall (up to 256 records of up to 4 KB of parameters) would leave each
    // pooled connection holding as much for good.
    if latest.len() > CACHED_ROWS {
        conn.shrink_buffers();
    }
    written
}

/// One statement upserting `records` (at most [`BATCH`]).
async fn insert(
    conn: &mut sqlx::AnyConnection,
    records: &[&AuditRecord],
    placeholders: Placeholders,
) -> Result<(), StoreError> {
    if records.is_empty() {
        return Ok(());
    }
    let sql = insert_rows(records.len(), placeholders);
    // Only the kept texts are prepared and kept by the connection. sqlx keeps up to 100
    // statements per connection, keyed by their text: each batch size a stall left behind
    // (9 to 256 rows, tens of KB each with its parameter types) stayed on every pooled
    // connection, a slow rise in the soak's memory (issue 42). A larger batch is parsed
    // each time instead: it is rare, and the parse is shared by its many records.
    let kept = records.len() <= CACHED_ROWS;
    let mut query = sqlx::query(&sql).persistent(kept);
    for r in records {
        query = query
            .bind(&r.id)
            .bind(r.at)
            .bind(&r.robot_id)
            .bind(&r.subject)
            .bind(&r.role)
            .bind(&r.node)
            .bind(&r.action)
            .bind(&r.tool)
            .bind(&r.params)
            .bind(&r.outcome)
            .bind(r.error_code)
            .bind(r.duration_ms)
            .bind(&r.idempotency_key)
            .bind(&r.confirmed_by)
            .bind(&r.session_id);
    }
    query.execute(conn).await?;
    Ok(())
}
