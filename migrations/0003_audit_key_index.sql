-- Whether a call with an idempotency key retries one already on record
-- (Store::audit_key_seen) is asked for every keyed call. By (robot_id, at) alone the
-- question read every record of the robot's last ten minutes: 5,500 rows and 116 ms a call
-- in the soak, at 10 calls a second per robot (docs/reliability.md).
CREATE INDEX audit_log_key_idx ON audit_log (robot_id, idempotency_key, at)
    WHERE idempotency_key IS NOT NULL;
