use serde::Serialize;

use super::group_commit::Write;
use super::{now_ms, Store, StoreError};

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    #[serde(skip)]
    pub id: String,
    pub connection_id: String,
    pub robot_id: String,
    pub subject: String,
    pub role: String,
    pub node: String,
    pub started_at: i64,
    pub connected_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub end_reason: Option<String>,
}

#[derive(Debug, Default)]
pub struct SessionFilter {
    pub robot_id: Option<String>,
    pub subject: Option<String>,
    pub active: Option<bool>,
    pub limit: i64,
}

impl Store {
    /// Writes a session's record at its start; returns once it is committed.
    pub async fn start_session(
        &self,
        id: &str,
        connection_id: &str,
        robot_id: &str,
        subject: &str,
        role: &str,
        node: &str,
    ) -> Result<(), StoreError> {
        self.writes
            .write(Write::StartSession {
                id: id.to_string(),
                connection_id: connection_id.to_string(),
                robot_id: robot_id.to_string(),
                subject: subject.to_string(),
                role: role.to_string(),
                node: node.to_string(),
                at: now_ms(),
            })
            .await?;
        Ok(())
    }

    /// Records the first `connected` of a session; later ones keep the first time.
    pub async fn session_connected(&self, id: &str) -> Result<(), StoreError> {
        self.writes
            .write(Write::SessionConnected {
                id: id.to_string(),
                at: now_ms(),
            })
            .await?;
        Ok(())
    }

    /// Closes a session's record with the time of this call. When the database refuses,
    /// the end is kept and written later ([`Store::retry_late_ends`]) and the error returned.
    pub async fn end_session(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        let write = Write::EndSession {
            id: id.to_string(),
            reason: reason.to_string(),
            at: now_ms(),
        };
        if let Err(e) = self.writes.write(write.clone()).await {
            self.late_ends.keep(write);
            return Err(e);
        }
        Ok(())
    }

    /// Ends every open session of this node: at shutdown, and at start for records a crash
    /// left open. Returns how many were ended.
    pub async fn end_open_sessions(&self, node: &str, reason: &str) -> Result<u64, StoreError> {
        let query = sqlx::query(
            "UPDATE sessions SET ended_at = $2, end_reason = $3 WHERE node = $1 AND ended_at IS NULL",
        )
        .bind(node)
        .bind(now_ms())
        .bind(reason);
        let result = self.execute_write(query).await?;
        Ok(result.rows_affected())
    }

    pub async fn sessions(&self, filter: &SessionFilter) -> Result<Vec<SessionRecord>, StoreError> {
        // Placeholders are numbered in the order the optional filters are present.
        let mut sql = String::from(
            "SELECT id, connection_id, robot_id, subject, role, node, started_at, connected_at, \
             ended_at, end_reason FROM sessions WHERE 1 = 1",
        );
        let mut n = 0;
        if filter.robot_id.is_some() {
            n += 1;
            sql.push_str(&format!(" AND robot_id = ${n}"));
        }
        if filter.subject.is_some() {
            n += 1;
            sql.push_str(&format!(" AND subject = ${n}"));
        }
        match filter.active {
            Some(true) => sql.push_str(" AND ended_at IS NULL"),
            Some(false) => sql.push_str(" AND ended_at IS NOT NULL"),
            None => {}
        }
        sql.push_str(&format!(" ORDER BY started_at DESC, id LIMIT ${}", n + 1));
        let mut query = sqlx::query_as(&sql);
        if let Some(robot_id) = &filter.robot_id {
            query = query.bind(robot_id);
        }
        if let Some(subject) = &filter.subject {
            query = query.bind(subject);
        }
        self.read_all(query.bind(filter.limit)).await
    }
}
