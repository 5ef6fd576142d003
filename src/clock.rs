//! Wall-clock time as the database and the wire carry it. Deadlines use `Instant`; these
//! are for timestamps only.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds; 0 if the clock reads before 1970 (a broken clock must not panic).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Unix seconds, as TURN credentials and certificates count time.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Unix seconds as a signed count, as X.509 validity and CRL dates compare them.
pub fn now_unix() -> i64 {
    i64::try_from(now_secs()).unwrap_or(i64::MAX)
}
