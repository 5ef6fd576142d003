use serde::Serialize;

use super::{now_ms, Store, StoreError};

/// What a subject may do with a robot: the protocol crate's type, shared with the robot
/// agent (which reads it from `meta.session.role`); stored as its lowercase text.
pub use signalling_protocol::Role;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub robot_id: String,
    pub subject: String,
    pub role: Role,
    pub created_at: i64,
}

#[derive(sqlx::FromRow)]
struct GrantRow {
    robot_id: String,
    subject: String,
    role: String,
    created_at: i64,
}

impl TryFrom<GrantRow> for Grant {
    type Error = StoreError;
    fn try_from(row: GrantRow) -> Result<Grant, StoreError> {
        Ok(Grant {
            role: Role::parse(&row.role).ok_or(StoreError::Corrupt("grants.role"))?,
            robot_id: row.robot_id,
            subject: row.subject,
            created_at: row.created_at,
        })
    }
}

impl Store {
    pub async fn put_grant(
        &self,
        robot_id: &str,
        subject: &str,
        role: Role,
    ) -> Result<(), StoreError> {
        let query = sqlx::query(
            "INSERT INTO grants (robot_id, subject, role, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (robot_id, subject) DO UPDATE SET role = excluded.role",
        )
        .bind(robot_id)
        .bind(subject)
        .bind(role.as_str())
        .bind(now_ms());
        self.execute_write(query).await?;
        Ok(())
    }

    pub async fn grant(&self, robot_id: &str, subject: &str) -> Result<Option<Role>, StoreError> {
        let role: Option<(String,)> = self
            .read_optional(
                sqlx::query_as("SELECT role FROM grants WHERE robot_id = $1 AND subject = $2")
                    .bind(robot_id)
                    .bind(subject),
            )
            .await?;
        role.map(|(r,)| Role::parse(&r).ok_or(StoreError::Corrupt("grants.role")))
            .transpose()
    }

    pub async fn grants(&self, robot_id: &str) -> Result<Vec<Grant>, StoreError> {
        let rows: Vec<GrantRow> = self
            .read_all(
                sqlx::query_as(
                    "SELECT robot_id, subject, role, created_at FROM grants WHERE robot_id = $1 \
                     ORDER BY subject",
                )
                .bind(robot_id),
            )
            .await?;
        rows.into_iter().map(Grant::try_from).collect()
    }

    /// Every grant a subject holds, for the user view of the console (`GET /v1/me/robots`).
    pub async fn grants_of_subject(&self, subject: &str) -> Result<Vec<Grant>, StoreError> {
        let rows: Vec<GrantRow> = self
            .read_all(
                sqlx::query_as(
                    "SELECT robot_id, subject, role, created_at FROM grants WHERE subject = $1 \
                     ORDER BY robot_id",
                )
                .bind(subject),
            )
            .await?;
        rows.into_iter().map(Grant::try_from).collect()
    }

    pub async fn delete_grant(&self, robot_id: &str, subject: &str) -> Result<bool, StoreError> {
        let query = sqlx::query("DELETE FROM grants WHERE robot_id = $1 AND subject = $2")
            .bind(robot_id)
            .bind(subject);
        let result = self.execute_write(query).await?;
        Ok(result.rows_affected() == 1)
    }
}
