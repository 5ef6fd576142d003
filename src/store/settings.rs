use super::{Store, StoreError};

impl Store {
    pub async fn setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> = self
            .read_optional(sqlx::query_as("SELECT value FROM settings WHERE key = $1").bind(key))
            .await?;
        Ok(row.map(|(v,)| v))
    }

    /// Stores `value` unless the key is already set; returns the value that is stored, so
    /// nodes starting together agree on one.
    pub async fn setting_insert_once(&self, key: &str, value: &str) -> Result<String, StoreError> {
        let query = sqlx::query(
            "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
        )
        .bind(key)
        .bind(value);
        self.execute_write(query).await?;
        self.setting(key)
            .await?
            .ok_or(StoreError::Corrupt("settings vanished after insert"))
    }
}
