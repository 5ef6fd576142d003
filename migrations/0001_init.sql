-- Portable between SQLite and PostgreSQL: TEXT and BIGINT only, times as unix milliseconds.

CREATE TABLE robots (
    robot_id TEXT PRIMARY KEY,
    name TEXT,
    metadata TEXT,
    -- ed25519 | ecdsa-p256 | ecdsa-p384 | rsa | x509, NULL until enrolled
    credential_kind TEXT,
    public_key TEXT,
    certificate_pem TEXT,
    certificate_serial TEXT,
    credential_revoked BIGINT NOT NULL DEFAULT 0,
    enrollment_token_hash TEXT,
    enrollment_token_expires_at BIGINT,
    created_at BIGINT NOT NULL,
    last_seen_at BIGINT,
    node TEXT
);

CREATE TABLE client_tokens (
    token_id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    revoked_at BIGINT
);

CREATE TABLE grants (
    robot_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    role TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (robot_id, subject)
);

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    connection_id TEXT NOT NULL,
    robot_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    role TEXT NOT NULL,
    node TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    connected_at BIGINT,
    ended_at BIGINT,
    end_reason TEXT
);
CREATE INDEX sessions_robot_idx ON sessions (robot_id);
CREATE INDEX sessions_subject_idx ON sessions (subject);
CREATE INDEX sessions_open_idx ON sessions (ended_at);

-- Keys (by fingerprint) and certificates (by serial) that must never log in again.
CREATE TABLE revoked_credentials (
    fingerprint TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    robot_id TEXT,
    revoked_at BIGINT NOT NULL,
    source TEXT NOT NULL
);

CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
