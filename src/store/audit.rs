//! The audit log: every ARP tool call through the gateway, every emergency stop and reset,
//! every takeover. Appended in batches by one writer per node; the API only reads it.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use super::{Store, StoreError};
use crate::shutdown::StopSignal;

/// Records waiting for the writer; past this, new tool calls are refused (nothing is done
/// that is not on record).
const QUEUE: usize = 4096;
/// Most records written in one transaction.
const BATCH: usize = 256;

/// Most bytes of a call's parameters kept in its record (cut at a character boundary).
pub const MAX_PARAMS_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub id: String,
    /// Unix milliseconds.
    pub at: i64,
    pub robot_id: String,
    pub subject: String,
    pub role: String,
    pub node: String,
    /// `tool_call`, `emergency_stop`, `reset_emergency_stop`, `takeover`.
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The call's parameters as JSON text, at most [`MAX_PARAMS_BYTES`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<String>,
    /// `completed`, `cancelled`, `failed`, `refused` (by the gateway), `unanswered`
    /// (the connection ended first).
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The person who approved it, when the robot asked for a confirmation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed_by: Option<String>,
    /// The ARP session (gateway connection) it belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// A page of a robot's audit log, oldest first: records at or after `from` and before `to`
/// (Unix ms), after the record `after` (a cursor: the last id of the previous page).
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    pub robot_id: String,
    pub from: Option<i64>,
    pub to: Option<i64>,
    pub after: Option<(i64, String)>,
    pub limit: i64,
}

/// Cuts `text` to at most `max` bytes on a character boundary.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The node's way into the audit log: a bounded queue in front of one writer task that
/// appends whatever has piled up in one transaction.
#[derive(Clone)]
pub struct AuditLog {
    queue: mpsc::Sender<AuditRecord>,
}

/// The writer's side, run by the node's tasks ([`AuditWriter::run`]).
pub struct AuditWriter {
    store: Store,
    queue: mpsc::Receiver<AuditRecord>,
}

impl AuditLog {
    pub fn new(store: Store) -> (AuditLog, AuditWriter) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (AuditLog { queue: tx }, AuditWriter { store, queue: rx })
    }

    /// Whether a record can be taken now: a caller that cannot be recorded is refused.
    pub fn has_room(&self) -> bool {
        self.queue.capacity() > 0
    }

    /// Queues a record; false (and logged) when the queue is full or the writer is gone.
    pub fn record(&self, record: AuditRecord) -> bool {
        match self.queue.try_send(record) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "audit record lost: the audit queue is full");
                false
            }
        }
    }
}

impl AuditWriter {
    /// Writes queued records until stopped; what is queued at the stop is still written.
    pub async fn run(mut self, mut stop: StopSignal) {
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                n = self.queue.recv_many(&mut batch, BATCH) => {
                    if n == 0 {
                        return;
                    }
                }
                _ = stop.stopped() => {
                    while let Ok(record) = self.queue.try_recv() {
                        batch.push(record);
                    }
                    self.write(&mut batch).await;
                    return;
                }
            }
            self.write(&mut batch).await;
        }
    }

    /// Writes a batch, trying again a few times: a record is dropped only after the
    /// database refused it repeatedly (and that is logged).
    async fn write(&self, batch: &mut Vec<AuditRecord>) {
        for attempt in 0..5u32 {
            match self.store.append_audit(batch).await {
                Ok(()) => break,
                Err(e) if attempt < 4 => {
                    tracing::warn!(error = %e, records = batch.len(), "cannot write audit records; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, records = batch.len(), "audit records lost")
                }
            }
        }
        batch.clear();
    }
}

impl Store {
    /// Appends records in one statement per [`BATCH`] records: one round trip for a
    /// batch, where a statement per record made PostgreSQL the gateway's limit (about
    /// 7,500 records/s, docs/benchmarks.md, "ARP through the gateway").
    pub async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        let mut tx = self.writer.begin().await?;
        for chunk in records.chunks(BATCH) {
            let sql = insert_rows(chunk.len());
            let mut query = sqlx::query(&sql);
            for r in chunk {
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
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// One page of a robot's audit log, oldest first.
    pub async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        let mut sql = String::from(
            "SELECT id, at, robot_id, subject, role, node, action, tool, params, outcome, \
             error_code, duration_ms, idempotency_key, confirmed_by, session_id \
             FROM audit_log WHERE robot_id = $1",
        );
        let mut n = 1;
        if query.from.is_some() {
            n += 1;
            sql.push_str(&format!(" AND at >= ${n}"));
        }
        if query.to.is_some() {
            n += 1;
            sql.push_str(&format!(" AND at < ${n}"));
        }
        if query.after.is_some() {
            // Each placeholder once: SQLite binds by position.
            sql.push_str(&format!(
                " AND (at > ${} OR (at = ${} AND id > ${}))",
                n + 1,
                n + 2,
                n + 3
            ));
            n += 3;
        }
        sql.push_str(&format!(" ORDER BY at, id LIMIT ${}", n + 1));
        let mut q = sqlx::query_as(&sql).bind(&query.robot_id);
        if let Some(from) = query.from {
            q = q.bind(from);
        }
        if let Some(to) = query.to {
            q = q.bind(to);
        }
        if let Some((at, id)) = &query.after {
            q = q.bind(*at).bind(*at).bind(id);
        }
        Ok(q.bind(query.limit).fetch_all(&self.pool).await?)
    }
}

/// `INSERT INTO audit_log (...) VALUES ($1, ..., $15), ($16, ...)` for `rows` records
/// (numbered placeholders: both SQLite and PostgreSQL read them).
fn insert_rows(rows: usize) -> String {
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
            let _ = write!(sql, "{separator}${}", row * COLUMNS + column + 1);
        }
        sql.push(')');
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: usize) -> AuditRecord {
        AuditRecord {
            id: format!("{n:05}"),
            at: 1_000 + n as i64,
            robot_id: "robot-1".into(),
            subject: "planner".into(),
            role: "operator".into(),
            node: "node-1".into(),
            action: "tool_call".into(),
            tool: Some("drive".into()),
            params: n.is_multiple_of(2).then(|| format!("{{\"n\":{n}}}")),
            outcome: "completed".into(),
            error_code: n.is_multiple_of(3).then_some(-40007),
            duration_ms: Some(n as i64),
            idempotency_key: None,
            confirmed_by: n.is_multiple_of(5).then(|| "alice".into()),
            session_id: Some("arp-1".into()),
        }
    }

    #[tokio::test]
    async fn batches_of_every_size_are_written_whole_and_in_order() {
        // A file: each pooled connection to `sqlite::memory:` would be a database of its own.
        let file = std::env::temp_dir().join(format!("audit-{}.db", uuid::Uuid::new_v4()));
        let store = Store::connect(&format!("sqlite://{}", file.display()))
            .await
            .expect("store");
        // Three statements (256, 256, 88 rows) in one transaction, then one row.
        let records: Vec<AuditRecord> = (0..601).map(record).collect();
        store.append_audit(&records[..600]).await.expect("append");
        store
            .append_audit(&records[600..])
            .await
            .expect("append one");
        let read = store
            .audit(&AuditQuery {
                robot_id: "robot-1".into(),
                limit: 1_000,
                ..AuditQuery::default()
            })
            .await
            .expect("read");
        let _ = std::fs::remove_file(&file);
        assert_eq!(read, records);
    }

    #[test]
    fn params_are_cut_on_a_character_boundary() {
        assert_eq!(bounded("abc", 4), "abc");
        assert_eq!(bounded("aé", 2), "a");
        assert_eq!(bounded("aéb", 3), "aé");
    }
}
