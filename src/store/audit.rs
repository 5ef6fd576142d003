//! The audit log: every ARP tool call through the gateway, every emergency stop and reset,
//! every takeover. Appended in batches by one writer per node; the API only reads it.
//!
//! Nothing runs that is not on record: a tool call's request is committed (with the batch
//! it joined, group commit) before the gateway forwards it, or the call is refused. A
//! call's outcome waits up to [`LINGER`] to share a later request's commit. Records
//! that nobody waits for (a call's outcome, an emergency stop) are never dropped: when the
//! database refuses them after retries they go to an append-only spill file (JSON lines,
//! fsync'd) and are loaded back once the database takes writes again; when even the file
//! cannot be written they wait in memory. Meanwhile `/readyz` says `degraded` and
//! `signalling_audit_spilled_records` counts them. Writes are upserts on the record's id,
//! so a call's outcome replaces its request, and loading a spill twice changes nothing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

mod insert;
mod spill;

use insert::{append_audit_on, Placeholders};

use spill::Spill;

use super::{Store, StoreError};
use crate::metrics::Metrics;
use crate::shutdown::StopSignal;

/// Records waiting for the writer; past this, new tool calls are refused (nothing is done
/// that is not on record).
const QUEUE: usize = 4096;
/// Most records written in one transaction.
const BATCH: usize = 256;
/// Longest one attempt at writing a batch may take: a call waits this long at most for its
/// request to be on record, and a database that hangs (locked, unreachable) is given up
/// on in bounded time.
const ATTEMPT: Duration = Duration::from_secs(1);
/// Pauses before the retries of a batch that failed, before it is spilled.
const RETRY_PAUSES: [Duration; 2] = [Duration::from_millis(100), Duration::from_millis(300)];
/// Longest a record nobody waits for (a call's outcome) is held back for a record that
/// somebody waits for (a later call's request) to share its commit: while calls keep
/// coming, a call costs one commit, not two (issue 44). Only outcomes wait so: e-stops and
/// takeovers are written at once. Outcomes were in memory until their commit before too;
/// this only makes that moment up to this much longer.
const LINGER: Duration = Duration::from_millis(50);
/// How often spilled records are offered to the database again.
const RELOAD_EVERY: Duration = Duration::from_secs(1);
/// Most records kept in memory when neither the database nor the spill file takes them.
const MAX_HELD: usize = 100_000;

/// Most bytes of a call's parameters kept in its record (cut at a character boundary).
pub const MAX_PARAMS_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
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
    /// `pending` (forwarded to the robot, no answer recorded yet), `completed`,
    /// `cancelled`, `failed`, `refused` (by the gateway, also when the call could not be
    /// put on record), `unanswered` (the connection ended first).
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

/// A record for the writer, and the caller waiting for its commit, if any.
struct Queued {
    record: AuditRecord,
    committed: Option<oneshot::Sender<bool>>,
    /// May wait up to [`LINGER`] for a record that somebody waits for.
    linger: bool,
}

impl Queued {
    /// Whether its batch should be written now.
    fn urgent(&self) -> bool {
        self.committed.is_some() || !self.linger
    }
}

/// The node's way into the audit log: a bounded queue in front of one writer task that
/// appends whatever has piled up in one transaction.
#[derive(Clone)]
pub struct AuditLog {
    queue: mpsc::Sender<Queued>,
    /// Records nobody waits for that found the queue full: the writer takes them with its
    /// next batch (a full queue means it has one to take), so they are not dropped.
    overflow: Arc<Mutex<Vec<AuditRecord>>>,
    /// Records outside the database (spill file and memory), as the writer counts them.
    waiting: Arc<AtomicUsize>,
}

/// The writer's side, run by the node's tasks ([`AuditWriter::run`]).
pub struct AuditWriter {
    store: Store,
    queue: mpsc::Receiver<Queued>,
    overflow: Arc<Mutex<Vec<AuditRecord>>>,
    spill: Spill,
    waiting: Arc<AtomicUsize>,
    metrics: Metrics,
}

impl AuditLog {
    /// The log and its writer; records the database refuses go to `spill_file`.
    pub fn new(store: Store, spill_file: PathBuf, metrics: Metrics) -> (AuditLog, AuditWriter) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let spill = Spill::open(spill_file);
        let waiting = Arc::new(AtomicUsize::new(spill.waiting()));
        metrics.audit.spilled.set(spill.waiting() as i64);
        let overflow = Arc::new(Mutex::new(Vec::new()));
        (
            AuditLog {
                queue: tx,
                overflow: overflow.clone(),
                waiting: waiting.clone(),
            },
            AuditWriter {
                store,
                queue: rx,
                overflow,
                spill,
                waiting,
                metrics,
            },
        )
    }

    /// Whether a record can be taken now: a caller that cannot be recorded is refused.
    pub fn has_room(&self) -> bool {
        self.queue.capacity() > 0
    }

    /// Queues a record that nobody waits for (an emergency stop, a takeover), to be
    /// written at once: the writer retries and spills it rather than drop it; past a full
    /// queue it waits beside it. False (and logged) only when even that is full or the
    /// writer is gone.
    pub fn record(&self, record: AuditRecord) -> bool {
        self.queue_unwaited(record, false)
    }

    /// As [`AuditLog::record`], for a tool call's outcome: written with the next record
    /// somebody waits for, or after [`LINGER`] at the latest.
    pub fn record_outcome(&self, record: AuditRecord) -> bool {
        self.queue_unwaited(record, true)
    }

    fn queue_unwaited(&self, record: AuditRecord, linger: bool) -> bool {
        let queued = Queued {
            record,
            committed: None,
            linger,
        };
        match self.queue.try_send(queued) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(queued)) => {
                let mut overflow = self.overflow.lock().unwrap_or_else(|p| p.into_inner());
                if overflow.len() < MAX_HELD {
                    overflow.push(queued.record);
                    return true;
                }
                tracing::error!("audit record lost: the audit queue and its overflow are full");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::error!("audit record lost: the audit writer is gone");
                false
            }
        }
    }

    /// Queues a record and waits until the batch it joined is committed: true once it is
    /// in the database. False when it is not (database refused it, queue full, writer
    /// gone): the caller must not act on it. Such a record is still written later, with
    /// outcome `refused`.
    pub async fn record_committed(&self, record: AuditRecord) -> bool {
        let (committed, done) = oneshot::channel();
        let queued = Queued {
            record,
            committed: Some(committed),
            linger: false,
        };
        if self.queue.try_send(queued).is_err() {
            return false;
        }
        done.await.unwrap_or(false)
    }

    /// Records outside the database, waiting to be loaded back; 0 when all is written.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

impl AuditWriter {
    /// Writes queued records until stopped; what is queued at the stop is still written
    /// (or spilled).
    pub async fn run(mut self, mut stop: StopSignal) {
        let mut batch = Vec::with_capacity(BATCH);
        // When the records held in `batch` (outcomes only) are written at the latest.
        let mut due: Option<Instant> = None;
        let mut next_reload = Instant::now() + RELOAD_EVERY;
        loop {
            // Records first: a call waiting for its request to be on record must not wait
            // behind reloads of the spill (each may take an attempt's whole deadline).
            let far = Instant::now() + RELOAD_EVERY;
            // Below BATCH: a batch that full is written at once.
            let room = BATCH - batch.len();
            tokio::select! {
                biased;
                _ = stop.stopped() => {
                    while let Ok(queued) = self.queue.try_recv() {
                        batch.push(queued);
                    }
                    self.flush(&mut batch).await;
                    return;
                }
                n = self.queue.recv_many(&mut batch, room) => {
                    if n == 0 {
                        self.flush(&mut batch).await;
                        return;
                    }
                    let fresh = &batch[batch.len() - n..];
                    if batch.len() >= BATCH || fresh.iter().any(Queued::urgent) {
                        self.flush(&mut batch).await;
                        due = None;
                    } else {
                        due.get_or_insert_with(|| Instant::now() + LINGER);
                    }
                }
                _ = tokio::time::sleep_until(due.unwrap_or(far)), if due.is_some() => {
                    self.flush(&mut batch).await;
                    due = None;
                }
                _ = tokio::time::sleep_until(next_reload), if self.spill.waiting() > 0 => {}
            }
            // Under a steady stream of records the reload still gets its turn (after the
            // records held back: they were queued first).
            if self.spill.waiting() > 0 && Instant::now() >= next_reload {
                self.flush(&mut batch).await;
                due = None;
                self.reload().await;
                next_reload = Instant::now() + RELOAD_EVERY;
            }
        }
    }

    /// Writes `batch` and what waits in the overflow, if there is anything.
    async fn flush(&mut self, batch: &mut Vec<Queued>) {
        self.take_overflow(batch);
        if !batch.is_empty() {
            self.write(batch).await;
        }
    }

    fn take_overflow(&self, batch: &mut Vec<Queued>) {
        let mut overflow = self.overflow.lock().unwrap_or_else(|p| p.into_inner());
        batch.extend(overflow.drain(..).map(|record| Queued {
            record,
            committed: None,
            linger: false,
        }));
    }

    /// Writes a batch. Callers waiting for it hear at once whether the first attempt
    /// committed; when it did not, their records become `refused` (their calls do not
    /// run) and the batch is retried, then spilled.
    async fn write(&mut self, batch: &mut Vec<Queued>) {
        let mut records = Vec::with_capacity(batch.len());
        let mut waiters = Vec::with_capacity(batch.len());
        for queued in batch.drain(..) {
            records.push(queued.record);
            waiters.push(queued.committed);
        }
        let first = self.attempt(&records).await;
        let Err(e) = first else {
            for waiter in waiters.into_iter().flatten() {
                let _ = waiter.send(true);
            }
            return;
        };
        tracing::warn!(error = %e, records = records.len(), "cannot write audit records; retrying");
        for (record, waiter) in records.iter_mut().zip(waiters) {
            if let Some(waiter) = waiter {
                record.outcome = "refused".into();
                let _ = waiter.send(false);
            }
        }
        for pause in RETRY_PAUSES {
            tokio::time::sleep(pause).await;
            match self.attempt(&records).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, records = records.len(), "cannot write audit records")
                }
            }
        }
        self.spill.hold(records).await;
        self.counted();
    }

    /// One try at writing `records`, within [`ATTEMPT`].
    async fn attempt(&self, records: &[AuditRecord]) -> Result<(), String> {
        match tokio::time::timeout(ATTEMPT, self.store.append_audit(records)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no commit within {ATTEMPT:?}")),
        }
    }

    /// Offers the spilled records to the database again; the spill is emptied once all
    /// are in.
    async fn reload(&mut self) {
        let records = self.spill.all().await;
        for chunk in records.chunks(BATCH * 4) {
            if let Err(e) = self.attempt(chunk).await {
                // Left where they are for the next try; those only in memory get another
                // chance at the file.
                tracing::debug!(error = %e, "spilled audit records not loaded back yet");
                if !self.spill.held.is_empty() {
                    self.spill.hold(Vec::new()).await;
                    self.counted();
                }
                return;
            }
        }
        self.spill.clear().await;
        self.counted();
        tracing::info!(
            records = records.len(),
            "audit records loaded back into the database"
        );
    }

    fn counted(&self) {
        let waiting = self.spill.waiting();
        self.waiting.store(waiting, Ordering::Relaxed);
        self.metrics.audit.spilled.set(waiting as i64);
    }
}

impl Store {
    /// Appends records in one statement per [`BATCH`] records: one round trip for a
    /// batch, where a statement per record made PostgreSQL the gateway's limit (about
    /// 7,500 records/s, docs/benchmarks.md, "ARP through the gateway").
    /// An id already on record is updated (a call's outcome after its request).
    pub async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        let mut conn = self.writer.lend().await?;
        let placeholders = if self.is_sqlite {
            Placeholders::Anonymous
        } else {
            Placeholders::Numbered
        };
        let result = append_audit_on(&mut conn, records, placeholders).await;
        conn.checked(result)
    }

    /// Whether `subject` already called a tool on `robot_id` with idempotency `key` at or
    /// after `since` (Unix milliseconds): a retry, which the robot answers with the first
    /// run's outcome.
    pub async fn audit_key_seen(
        &self,
        robot_id: &str,
        subject: &str,
        key: &str,
        since: i64,
    ) -> Result<bool, StoreError> {
        let row: Option<(i64,)> = self
            .read_optional(
                sqlx::query_as(
                    "SELECT at FROM audit_log WHERE robot_id = $1 AND subject = $2 \
                     AND idempotency_key = $3 AND at >= $4 LIMIT 1",
                )
                .bind(robot_id)
                .bind(subject)
                .bind(key)
                .bind(since),
            )
            .await?;
        Ok(row.is_some())
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
        self.read_all(q.bind(query.limit)).await
    }
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

    /// Issue 42: a connection keeps prepared only the batch sizes whose statement text is
    /// kept. Before, every batch size a stall produced stayed prepared on every pooled
    /// connection, tens of KB each: the soak's slow rise in memory. PostgreSQL lists a
    /// session's prepared statements; runs when DATABASE_URL points at PostgreSQL (CI's
    /// `postgres` step).
    #[tokio::test]
    async fn a_connection_keeps_prepared_only_the_kept_batch_sizes() {
        use sqlx::Connection as _;
        let Some(url) = std::env::var("DATABASE_URL")
            .ok()
            .filter(|url| url.starts_with("postgres"))
        else {
            eprintln!("skipped: DATABASE_URL (PostgreSQL) is not set");
            return;
        };
        sqlx::any::install_default_drivers();
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::AnyConnection::connect(&url)
            .await
            .expect("PostgreSQL");
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&mut admin)
            .await
            .expect("create schema");
        let separator = if url.contains('?') { '&' } else { '?' };
        let store = Store::connect(&format!("{url}{separator}options=-csearch_path%3D{schema}"))
            .await
            .expect("store");
        let mut conn = store.readers.lend().await.expect("a connection");
        let sizes = 1..=40;
        let records: Vec<AuditRecord> = (0..sizes.clone().sum()).map(record).collect();
        let mut next = 0;
        for size in sizes {
            let batch = &records[next..next + size];
            append_audit_on(&mut conn, batch, Placeholders::Numbered)
                .await
                .expect("append");
            next += size;
        }
        let prepared: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_prepared_statements \
             WHERE statement LIKE 'INSERT INTO audit_log%'",
        )
        .fetch_one(&mut *conn)
        .await
        .expect("prepared statements");
        let written: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log")
            .fetch_one(&mut *conn)
            .await
            .expect("count");
        drop(conn);
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&mut admin)
            .await
            .expect("drop schema");
        assert_eq!(written, records.len() as i64);
        assert_eq!(prepared, insert::CACHED_ROWS as i64);
    }

    /// Whether a keyed call retries another is asked for every keyed call: by the key's
    /// index, not by a walk through the robot's recent records (issue 42's soak: 5,500
    /// rows and 116 ms a call on PostgreSQL).
    #[tokio::test]
    async fn a_retry_is_looked_up_by_its_key() {
        let (store, file) = Store::scratch("audit").await;
        let explain = sqlx::query_as(
            "EXPLAIN QUERY PLAN SELECT at FROM audit_log WHERE robot_id = $1 AND subject = $2 \
             AND idempotency_key = $3 AND at >= $4 LIMIT 1",
        )
        .bind("robot-1")
        .bind("planner")
        .bind("key-1")
        .bind(0_i64);
        let plan: Vec<(i64, i64, i64, String)> = store.read_all(explain).await.expect("plan");
        let mut keyed = record(1);
        keyed.idempotency_key = Some("key-1".into());
        store.append_audit(&[keyed]).await.expect("append");
        let seen = store.audit_key_seen("robot-1", "planner", "key-1", 0).await;
        let other = store.audit_key_seen("robot-1", "planner", "key-2", 0).await;
        let _ = std::fs::remove_file(&file);
        let plan: Vec<String> = plan.into_iter().map(|row| row.3).collect();
        assert!(
            plan.iter().any(|step| step.contains("audit_log_key_idx")),
            "{plan:?}"
        );
        assert!(seen.expect("seen"));
        assert!(!other.expect("not seen"));
    }

    #[tokio::test]
    async fn batches_of_every_size_are_written_whole_and_in_order() {
        // A file: each pooled connection to `sqlite::memory:` would be a database of its own.
        let (store, file) = Store::scratch("audit").await;
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

    #[tokio::test]
    async fn an_outcome_replaces_its_request_and_a_repeat_changes_nothing() {
        let (store, file) = Store::scratch("audit").await;
        let mut request = record(1);
        request.outcome = "pending".into();
        store.append_audit(&[request]).await.expect("request");
        let outcome = record(1);
        // Twice in one batch (a spill loaded back beside memory), then once more.
        store
            .append_audit(&[outcome.clone(), outcome.clone()])
            .await
            .expect("outcome");
        store
            .append_audit(std::slice::from_ref(&outcome))
            .await
            .expect("again");
        let read = store
            .audit(&AuditQuery {
                robot_id: "robot-1".into(),
                limit: 10,
                ..AuditQuery::default()
            })
            .await
            .expect("read");
        let _ = std::fs::remove_file(&file);
        assert_eq!(read, vec![outcome]);
    }

    #[tokio::test]
    async fn an_outcome_held_back_is_on_record_with_the_next_request_or_at_the_stop() {
        let dir = std::env::temp_dir().join(format!("audit-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let url = format!("sqlite://{}/a.db", dir.display());
        let store = Store::connect(&url).await.expect("store");
        let (log, writer) = AuditLog::new(store.clone(), dir.join("spill"), Metrics::new());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(writer.run(StopSignal::new(stopped)));
        let read = |store: Store| async move {
            let query = AuditQuery {
                robot_id: "robot-1".into(),
                limit: 10,
                ..AuditQuery::default()
            };
            store.audit(&query).await.expect("read")
        };
        // An outcome queued before a request is committed no later than the request.
        assert!(log.record_outcome(record(1)));
        assert!(log.record_committed(record(2)).await);
        assert_eq!(read(store.clone()).await, vec![record(1), record(2)]);
        // One held back when the node stops is still written.
        assert!(log.record_outcome(record(3)));
        stop.send(true).expect("stop");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the writer stops")
            .expect("writer");
        assert_eq!(read(store).await, vec![record(1), record(2), record(3)]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn params_are_cut_on_a_character_boundary() {
        assert_eq!(bounded("abc", 4), "abc");
        assert_eq!(bounded("aé", 2), "a");
        assert_eq!(bounded("aéb", 3), "aé");
    }
}
