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

-- A robot's request for a person's approval of a program's call, while it waits: the first
-- answer wins (decided_at set once), on whichever node the person answers.
CREATE TABLE confirmations (
    id TEXT PRIMARY KEY,
    robot_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    action TEXT NOT NULL,
    tool TEXT,
    arguments TEXT,
    safety_level TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    confirmed INTEGER,
    decided_by TEXT,
    decided_at BIGINT
);
CREATE INDEX confirmations_robot_idx ON confirmations (robot_id, expires_at);
