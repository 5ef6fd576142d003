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
        let query = sqlx::query(
            "INSERT INTO revoked_credentials (fingerprint, kind, robot_id, revoked_at, source) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (fingerprint) DO NOTHING",
        )
        .bind(fingerprint)
        .bind(kind)
        .bind(robot_id)
        .bind(now_ms())
        .bind(source);
        self.execute_write(query).await?;
        Ok(())
    }

    /// Records many revoked entries (a CRL's) in one transaction; idempotent.
    pub async fn revoke_many(
        &self,
        entries: &[String],
        kind: &str,
        source: &str,
    ) -> Result<(), StoreError> {
        let at = now_ms();
        use sqlx::Connection as _;
        let mut conn = self.writer.lend().await?;
        let written = async {
            let mut tx = conn.begin().await?;
            for entry in entries {
                sqlx::query(
                    "INSERT INTO revoked_credentials (fingerprint, kind, robot_id, revoked_at, \
                     source) VALUES ($1, $2, NULL, $3, $4) ON CONFLICT (fingerprint) DO NOTHING",
                )
                .bind(entry)
                .bind(kind)
                .bind(at)
                .bind(source)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await
        }
        .await;
        conn.checked(written)?;
        Ok(())
    }

    /// Whether any of `fingerprints` is revoked: one query.
    pub async fn is_revoked(&self, fingerprints: &[String]) -> Result<bool, StoreError> {
        if fingerprints.is_empty() {
            return Ok(false);
        }
        let placeholders: Vec<String> = (1..=fingerprints.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT COUNT(*) FROM revoked_credentials WHERE fingerprint IN ({})",
            placeholders.join(", ")
        );
        let mut query = sqlx::query_as::<_, (i64,)>(&sql);
        for fingerprint in fingerprints {
            query = query.bind(fingerprint);
        }
        let (count,) = self.read_one(query).await?;
        Ok(count > 0)
    }
}
