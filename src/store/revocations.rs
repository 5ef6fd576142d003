use super::{now_ms, Store, StoreError};

impl Store {
    /// Records a revoked key fingerprint or certificate serial; idempotent.
    pub async fn revoke_credential(
        &self,
        fingerprint: &str,
        kind: &str,
        robot_id: Option<&str>,
        source: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO revoked_credentials (fingerprint, kind, robot_id, revoked_at, source) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (fingerprint) DO NOTHING",
        )
        .bind(fingerprint)
        .bind(kind)
        .bind(robot_id)
        .bind(now_ms())
        .bind(source)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    pub async fn is_revoked(&self, fingerprints: &[String]) -> Result<bool, StoreError> {
        for fingerprint in fingerprints {
            let hit: Option<(String,)> = sqlx::query_as(
                "SELECT fingerprint FROM revoked_credentials WHERE fingerprint = $1",
            )
            .bind(fingerprint)
            .fetch_optional(&self.pool)
            .await?;
            if hit.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
