use super::{now_ms, Store, StoreError};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClientToken {
    pub token_id: String,
    pub subject: String,
    pub expires_at: i64,
    pub revoked_at: Option<i64>,
}

impl Store {
    pub async fn create_client_token(
        &self,
        token_id: &str,
        subject: &str,
        token_hash: &str,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let query = sqlx::query(
            "INSERT INTO client_tokens (token_id, subject, token_hash, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(token_id)
        .bind(subject)
        .bind(token_hash)
        .bind(now_ms())
        .bind(expires_at);
        self.execute_write(query).await?;
        Ok(())
    }

    /// Every client token (never its secret: only the hash is stored), newest first.
    pub async fn client_tokens(&self, limit: i64) -> Result<Vec<ClientToken>, StoreError> {
        self.read_all(
            sqlx::query_as(
                "SELECT token_id, subject, expires_at, revoked_at FROM client_tokens \
                 ORDER BY created_at DESC, token_id LIMIT $1",
            )
            .bind(limit),
        )
        .await
    }

    /// Looks a token up by the hash of its secret; lookups by hash reveal nothing about
    /// stored secrets, so no constant-time comparison is needed here.
    pub async fn client_token_by_hash(
        &self,
        token_hash: &str,
    ) -> Result<Option<ClientToken>, StoreError> {
        self.read_optional(
            sqlx::query_as(
                "SELECT token_id, subject, expires_at, revoked_at FROM client_tokens \
                 WHERE token_hash = $1",
            )
            .bind(token_hash),
        )
        .await
    }

    /// Whether the token is revoked or gone (a socket that logged in with it must close).
    pub async fn client_token_withdrawn(&self, token_id: &str) -> Result<bool, StoreError> {
        let row: Option<(Option<i64>,)> = self
            .read_optional(
                sqlx::query_as("SELECT revoked_at FROM client_tokens WHERE token_id = $1")
                    .bind(token_id),
            )
            .await?;
        Ok(!matches!(row, Some((None,))))
    }

    /// `false` if no such token exists.
    pub async fn revoke_client_token(&self, token_id: &str) -> Result<bool, StoreError> {
        let query = sqlx::query(
            "UPDATE client_tokens SET revoked_at = COALESCE(revoked_at, $2) WHERE token_id = $1",
        )
        .bind(token_id)
        .bind(now_ms());
        let result = self.execute_write(query).await?;
        Ok(result.rows_affected() == 1)
    }
}
