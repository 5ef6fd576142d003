use super::group_commit::Write;
use super::{now_ms, Store, StoreError};

/// How a robot proves who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A bare public key in the PKI module's stored form (`kind:base64`).
    PublicKey { kind: String, stored: String },
    /// A certificate chain (PEM, leaf first) and the leaf's serial.
    Certificate { chain_pem: String, serial: String },
}

#[derive(Debug, Clone)]
pub struct RobotRecord {
    pub robot_id: String,
    pub name: Option<String>,
    pub metadata: Option<serde_json::Value>,
    pub credential: Option<Credential>,
    pub credential_revoked: bool,
    pub enrollment_token_hash: Option<String>,
    pub enrollment_token_expires_at: Option<i64>,
    pub created_at: i64,
    pub last_seen_at: Option<i64>,
    pub node: Option<String>,
}

impl RobotRecord {
    /// The contract's `credential` field: "ed25519", "x509", another key kind, or none.
    pub fn credential_kind(&self) -> Option<&str> {
        match &self.credential {
            Some(Credential::PublicKey { kind, .. }) => Some(kind),
            Some(Credential::Certificate { .. }) => Some("x509"),
            None => None,
        }
    }
}

pub struct NewRobot<'a> {
    pub robot_id: &'a str,
    pub name: Option<&'a str>,
    pub metadata: Option<&'a serde_json::Value>,
    pub enrollment_token_hash: Option<&'a str>,
    pub enrollment_token_expires_at: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct RobotRow {
    robot_id: String,
    name: Option<String>,
    metadata: Option<String>,
    credential_kind: Option<String>,
    public_key: Option<String>,
    certificate_pem: Option<String>,
    certificate_serial: Option<String>,
    credential_revoked: i64,
    enrollment_token_hash: Option<String>,
    enrollment_token_expires_at: Option<i64>,
    created_at: i64,
    last_seen_at: Option<i64>,
    node: Option<String>,
}

impl TryFrom<RobotRow> for RobotRecord {
    type Error = StoreError;

    fn try_from(row: RobotRow) -> Result<Self, StoreError> {
        let credential = match row.credential_kind.as_deref() {
            None => None,
            Some("x509") => Some(Credential::Certificate {
                chain_pem: row
                    .certificate_pem
                    .ok_or(StoreError::Corrupt("robots.certificate_pem"))?,
                serial: row.certificate_serial.unwrap_or_default(),
            }),
            Some(kind) => Some(Credential::PublicKey {
                kind: kind.to_string(),
                stored: row
                    .public_key
                    .ok_or(StoreError::Corrupt("robots.public_key"))?,
            }),
        };
        let metadata = match row.metadata {
            Some(text) => Some(
                serde_json::from_str(&text).map_err(|_| StoreError::Corrupt("robots.metadata"))?,
            ),
            None => None,
        };
        Ok(RobotRecord {
            robot_id: row.robot_id,
            name: row.name,
            metadata,
            credential,
            credential_revoked: row.credential_revoked != 0,
            enrollment_token_hash: row.enrollment_token_hash,
            enrollment_token_expires_at: row.enrollment_token_expires_at,
            created_at: row.created_at,
            last_seen_at: row.last_seen_at,
            node: row.node,
        })
    }
}

const ROBOT_COLUMNS: &str =
    "robot_id, name, metadata, credential_kind, public_key, certificate_pem, \
     certificate_serial, credential_revoked, enrollment_token_hash, enrollment_token_expires_at, \
     created_at, last_seen_at, node";

impl Store {
    /// Inserts a robot; `Ok(false)` if the id is taken.
    pub async fn create_robot(&self, robot: NewRobot<'_>) -> Result<bool, StoreError> {
        let metadata = robot.metadata.map(|m| m.to_string());
        let query = sqlx::query(
            "INSERT INTO robots (robot_id, name, metadata, enrollment_token_hash, \
             enrollment_token_expires_at, created_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (robot_id) DO NOTHING",
        )
        .bind(robot.robot_id)
        .bind(robot.name)
        .bind(metadata)
        .bind(robot.enrollment_token_hash)
        .bind(robot.enrollment_token_expires_at)
        .bind(now_ms());
        let result = self.execute_write(query).await?;
        Ok(result.rows_affected() == 1)
    }

    pub async fn robot(&self, robot_id: &str) -> Result<Option<RobotRecord>, StoreError> {
        let sql = format!("SELECT {ROBOT_COLUMNS} FROM robots WHERE robot_id = $1");
        let row: Option<RobotRow> = self
            .read_optional(sqlx::query_as(&sql).bind(robot_id))
            .await?;
        row.map(RobotRecord::try_from).transpose()
    }

    pub async fn robots(&self) -> Result<Vec<RobotRecord>, StoreError> {
        let sql = format!("SELECT {ROBOT_COLUMNS} FROM robots ORDER BY robot_id");
        let rows: Vec<RobotRow> = self.read_all(sqlx::query_as(&sql)).await?;
        rows.into_iter().map(RobotRecord::try_from).collect()
    }

    /// Deletes the robot and its grants; `false` if it did not exist.
    pub async fn delete_robot(&self, robot_id: &str) -> Result<bool, StoreError> {
        use sqlx::Connection as _;
        let mut conn = self.writer.lend().await?;
        let deleted = async {
            let mut tx = conn.begin().await?;
            sqlx::query("DELETE FROM grants WHERE robot_id = $1")
                .bind(robot_id)
                .execute(&mut *tx)
                .await?;
            let result = sqlx::query("DELETE FROM robots WHERE robot_id = $1")
                .bind(robot_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(result)
        }
        .await;
        let result = conn.checked(deleted)?;
        Ok(result.rows_affected() == 1)
    }

    /// Replaces the enrollment token (the previous one stops working).
    pub async fn set_enrollment_token(
        &self,
        robot_id: &str,
        token_hash: &str,
        expires_at: i64,
    ) -> Result<bool, StoreError> {
        let query = sqlx::query(
            "UPDATE robots SET enrollment_token_hash = $2, enrollment_token_expires_at = $3 \
             WHERE robot_id = $1",
        )
        .bind(robot_id)
        .bind(token_hash)
        .bind(expires_at);
        let result = self.execute_write(query).await?;
        Ok(result.rows_affected() == 1)
    }

    /// Stores a new credential and consumes the enrollment token in one statement, so a
    /// token can be used once even when two requests race. `false` if the token was already
    /// used or replaced meanwhile.
    pub async fn enroll(
        &self,
        robot_id: &str,
        token_hash: &str,
        credential: &Credential,
    ) -> Result<bool, StoreError> {
        let (kind, public_key, certificate, serial) = match credential {
            Credential::PublicKey { kind, stored } => {
                (kind.as_str(), Some(stored.as_str()), None, None)
            }
            Credential::Certificate { chain_pem, serial } => (
                "x509",
                None,
                Some(chain_pem.as_str()),
                Some(serial.as_str()),
            ),
        };
        let query = sqlx::query(
            "UPDATE robots SET credential_kind = $3, public_key = $4, certificate_pem = $5, \
             certificate_serial = $6, credential_revoked = 0, enrollment_token_hash = NULL, \
             enrollment_token_expires_at = NULL \
             WHERE robot_id = $1 AND enrollment_token_hash = $2",
        )
        .bind(robot_id)
        .bind(token_hash)
        .bind(kind)
        .bind(public_key)
        .bind(certificate)
        .bind(serial);
        let result = self.execute_write(query).await?;
        Ok(result.rows_affected() == 1)
    }

    /// Records a certificate chain a robot proved at login as its credential: a new record
    /// (`create`, auto-registration) or a record that had no credential yet. Never replaces
    /// an existing credential: enrollment does that. The caller re-reads the record to see
    /// whose credential won a race.
    pub async fn record_presented_certificate(
        &self,
        robot_id: &str,
        credential: &Credential,
        create: bool,
    ) -> Result<(), StoreError> {
        let Credential::Certificate { chain_pem, serial } = credential else {
            return Err(StoreError::Corrupt(
                "a presented credential is a certificate",
            ));
        };
        let query = if create {
            sqlx::query(
                "INSERT INTO robots (robot_id, credential_kind, certificate_pem, \
                 certificate_serial, created_at) VALUES ($1, 'x509', $2, $3, $4) \
                 ON CONFLICT (robot_id) DO NOTHING",
            )
            .bind(robot_id)
            .bind(chain_pem)
            .bind(serial)
            .bind(now_ms())
        } else {
            sqlx::query(
                "UPDATE robots SET credential_kind = 'x509', certificate_pem = $2, \
                 certificate_serial = $3 WHERE robot_id = $1 AND credential_kind IS NULL \
                 AND credential_revoked = 0",
            )
            .bind(robot_id)
            .bind(chain_pem)
            .bind(serial)
        };
        self.execute_write(query).await?;
        Ok(())
    }

    pub async fn mark_credential_revoked(&self, robot_id: &str) -> Result<bool, StoreError> {
        let query = sqlx::query("UPDATE robots SET credential_revoked = 1 WHERE robot_id = $1")
            .bind(robot_id);
        let result = self.execute_write(query).await?;
        Ok(result.rows_affected() == 1)
    }

    /// Records a robot's login on `node`, if what it proved still stands: the robot exists,
    /// is not marked revoked, still holds exactly `credential` (not re-enrolled since the
    /// challenge read it), and none of `entries` is on the revocation list. The check and
    /// the write are one statement, so nothing can come between them; `false` when the login
    /// no longer stands (nothing is written then). Logins arriving together share one
    /// transaction (group commit); this returns once the update is committed.
    pub async fn record_login(
        &self,
        robot_id: &str,
        node: &str,
        credential: &Credential,
        entries: &[String],
    ) -> Result<bool, StoreError> {
        let (kind, column, value) = match credential {
            Credential::PublicKey { kind, stored } => (kind.clone(), "public_key", stored.clone()),
            Credential::Certificate { chain_pem, .. } => {
                ("x509".to_string(), "certificate_pem", chain_pem.clone())
            }
        };
        let changed = self
            .writes
            .write(Write::Login {
                robot_id: robot_id.to_string(),
                node: node.to_string(),
                at: now_ms(),
                kind,
                column,
                value,
                entries: entries.to_vec(),
            })
            .await?;
        Ok(changed == 1)
    }
}
