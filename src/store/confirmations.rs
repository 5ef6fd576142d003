//! Confirmations waiting for a person: written by the gateway that holds the program's
//! session, answered from the console on any node; the first answer wins.

use serde::Serialize;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Confirmation {
    pub id: String,
    pub robot_id: String,
    pub session_id: String,
    /// The program's subject, whose call the robot asks about.
    pub requested_by: String,
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The call's arguments as JSON text (at most 4 KiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub safety_level: Option<String>,
    /// Unix milliseconds.
    pub created_at: i64,
    pub expires_at: i64,
}

/// A person's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub confirmed: bool,
    pub decided_by: String,
}

impl Store {
    pub async fn add_confirmation(&self, c: &Confirmation) -> Result<(), StoreError> {
        let query = sqlx::query(
            "INSERT INTO confirmations (id, robot_id, session_id, requested_by, action, tool, \
             arguments, safety_level, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&c.id)
        .bind(&c.robot_id)
        .bind(&c.session_id)
        .bind(&c.requested_by)
        .bind(&c.action)
        .bind(&c.tool)
        .bind(&c.arguments)
        .bind(&c.safety_level)
        .bind(c.created_at)
        .bind(c.expires_at);
        self.execute_write(query).await?;
        Ok(())
    }

    /// Undecided confirmations of `robot_id` that have not expired at `now`.
    pub async fn open_confirmations(
        &self,
        robot_id: &str,
        now: i64,
    ) -> Result<Vec<Confirmation>, StoreError> {
        self.read_all(
            sqlx::query_as(
                "SELECT id, robot_id, session_id, requested_by, action, tool, arguments, \
                 safety_level, created_at, expires_at FROM confirmations \
                 WHERE robot_id = $1 AND decided_at IS NULL AND expires_at > $2 \
                 ORDER BY created_at, id",
            )
            .bind(robot_id)
            .bind(now),
        )
        .await
    }

    /// Undecided, unexpired confirmations of the robots `subject` owns: what the console
    /// shows that person (owners answer them).
    pub async fn open_confirmations_for(
        &self,
        subject: &str,
        now: i64,
    ) -> Result<Vec<Confirmation>, StoreError> {
        self.read_all(
            sqlx::query_as(
                "SELECT c.id, c.robot_id, c.session_id, c.requested_by, c.action, c.tool, \
                 c.arguments, c.safety_level, c.created_at, c.expires_at \
                 FROM confirmations c JOIN grants g ON g.robot_id = c.robot_id \
                 WHERE g.subject = $1 AND g.role = 'owner' \
                 AND c.decided_at IS NULL AND c.expires_at > $2 ORDER BY c.created_at, c.id",
            )
            .bind(subject)
            .bind(now),
        )
        .await
    }

    pub async fn confirmation(&self, id: &str) -> Result<Option<Confirmation>, StoreError> {
        self.read_optional(
            sqlx::query_as(
                "SELECT id, robot_id, session_id, requested_by, action, tool, arguments, \
                 safety_level, created_at, expires_at FROM confirmations WHERE id = $1",
            )
            .bind(id),
        )
        .await
    }

    /// Records a person's answer if none came before and the request has not expired at
    /// `now`; true if this answer is the one that counts.
    pub async fn decide_confirmation(
        &self,
        id: &str,
        decision: &Decision,
        now: i64,
    ) -> Result<bool, StoreError> {
        let query = sqlx::query(
            "UPDATE confirmations SET confirmed = $2, decided_by = $3, decided_at = $4 \
             WHERE id = $1 AND decided_at IS NULL AND expires_at > $4",
        )
        .bind(id)
        .bind(i64::from(decision.confirmed))
        .bind(&decision.decided_by)
        .bind(now);
        let done = self.execute_write(query).await?;
        Ok(done.rows_affected() == 1)
    }

    /// The answer to a confirmation, once there is one.
    pub async fn decision(&self, id: &str) -> Result<Option<Decision>, StoreError> {
        let row: Option<(Option<i64>, Option<String>)> = self
            .read_optional(
                sqlx::query_as("SELECT confirmed, decided_by FROM confirmations WHERE id = $1")
                    .bind(id),
            )
            .await?;
        Ok(match row {
            Some((Some(confirmed), Some(decided_by))) => Some(Decision {
                confirmed: confirmed == 1,
                decided_by,
            }),
            _ => None,
        })
    }
}
