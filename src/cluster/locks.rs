//! The cluster-wide control lock of a driven robot: SET NX PX with a fencing counter,
//! renewed by the holder's heartbeat, taken back after Redis lost its data.

use super::{lock_subject, Cluster, ClusterError, LockOutcome};

/// Takes the lock if free: SET NX PX with the next fencing token in the value.
pub(super) const LOCK: &str = r"
local fence = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. '|' .. fence
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then return {1, value} end
return {0, redis.call('GET', KEYS[1]) or ''}";

/// Extends the lock while it is ours. When it is gone and ARGV[3] is 1 (Redis lost its
/// data: restarted empty), takes it back unless someone else took it first. 0 when
/// someone else holds it now, 3 when it is gone (the session ended meanwhile).
pub(super) const RENEW: &str = r"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not current then
  if ARGV[3] == '1' and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 2 end
  return 3
end
return 0";

impl Cluster {
    /// Tries to take the robot's control lock for a session.
    pub async fn lock(
        &self,
        robot_id: &str,
        session_id: &str,
        subject: &str,
    ) -> Result<LockOutcome, ClusterError> {
        // The subject goes last: it may contain '|', the holder's fields before it do not.
        let holder = format!("{}|{}|{}", self.node, session_id, subject);
        let mut conn = self.conn.clone();
        let ttl = self.config.lock_ttl.as_millis() as u64;
        let (taken, value): (i64, String) = self
            .timed(async {
                self.scripts
                    .lock
                    .key(self.key(&["lock:", robot_id]))
                    .key(self.key(&["fence:", robot_id]))
                    .arg(holder)
                    .arg(ttl)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        if taken == 1 {
            return Ok(LockOutcome::Acquired(value));
        }
        Ok(LockOutcome::Held {
            subject: lock_subject(&value).to_string(),
        })
    }

    /// Releases a lock this node holds (no-op if it expired and another took it).
    pub async fn unlock(&self, robot_id: &str, value: &str) -> Result<(), ClusterError> {
        let mut conn = self.conn.clone();
        self.timed(async {
            self.scripts
                .delete_if
                .key(self.key(&["lock:", robot_id]))
                .arg(value)
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await?;
        Ok(())
    }

    /// Renews held locks; returns those (robot, value) another holder has now. `retake`
    /// after Redis lost its data: locks that vanished are taken again. (Never otherwise:
    /// a lock released by a session that ended after `held` was read must stay free.)
    pub async fn renew_locks(
        &self,
        held: &[(String, String)],
        retake: bool,
    ) -> Result<Vec<(String, String)>, ClusterError> {
        let ttl = self.config.lock_ttl.as_millis() as u64;
        let mut lost = Vec::new();
        for (robot_id, value) in held {
            let mut conn = self.conn.clone();
            let renewed: i64 = self
                .timed(async {
                    self.scripts
                        .renew
                        .key(self.key(&["lock:", robot_id]))
                        .arg(value)
                        .arg(ttl)
                        .arg(if retake { "1" } else { "0" })
                        .invoke_async(&mut conn)
                        .await
                })
                .await?;
            if renewed == 0 {
                lost.push((robot_id.clone(), value.clone()));
            }
        }
        Ok(lost)
    }
}
