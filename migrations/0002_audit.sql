-- What programs did to robots through the ARP gateway, and every emergency stop: appended,
-- never changed through the API.
CREATE TABLE audit_log (
    id TEXT PRIMARY KEY,
    at BIGINT NOT NULL,
    robot_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    role TEXT NOT NULL,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    tool TEXT,
    params TEXT,
    outcome TEXT NOT NULL,
    error_code BIGINT,
    duration_ms BIGINT,
    idempotency_key TEXT,
    confirmed_by TEXT,
    session_id TEXT
);
CREATE INDEX audit_log_robot_at_idx ON audit_log (robot_id, at);
