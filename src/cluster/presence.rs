//! Which node each online robot is on: written by the robot's node (through the outbox),
//! read by every other node before it routes an offer, and written again after a lapse.

use std::collections::HashMap;
use std::sync::Arc;

use redis::AsyncCommands;

use super::{parse_presence, Cluster, ClusterError, RemoteRobot};

/// Robots written per pipeline when this node writes its presence again after a lapse.
const REASSERT_BATCH: usize = 512;
use crate::delivery::ConnId;

/// Writes a robot's presence unless another node has written a newer one.
pub(super) const SET_UNLESS_ELSEWHERE: &str = r"
local current = redis.call('GET', KEYS[1])
if (not current) or string.sub(current, 1, #ARGV[2]) == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 0";

/// Reads a robot's presence if its node's heartbeat lease is alive.
pub(super) const LOCATE: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return false end
local node = string.match(v, '^[^\n]+')
if node and redis.call('EXISTS', ARGV[1] .. node) == 1 then return v end
return false";

impl Cluster {
    /// The node and socket of a robot online on another node whose lease is alive.
    pub async fn locate(&self, robot_id: &str) -> Result<Option<RemoteRobot>, ClusterError> {
        let mut conn = self.conn.clone();
        let key = self.key(&["robot:", robot_id]);
        let alive = self.alive_prefix();
        let value: Option<String> = self
            .timed(async move {
                self.scripts
                    .locate
                    .key(key)
                    .arg(alive)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(value
            .as_deref()
            .and_then(parse_presence)
            .map(|(node, conn)| RemoteRobot {
                node: Arc::from(node),
                conn: ConnId::from(conn),
            }))
    }

    /// The nodes (alive) where these robots are online, for the API.
    pub async fn nodes_of(
        &self,
        robot_ids: &[&str],
    ) -> Result<HashMap<String, String>, ClusterError> {
        if robot_ids.is_empty() {
            return Ok(HashMap::new());
        }
        let keys: Vec<String> = robot_ids
            .iter()
            .map(|id| self.key(&["robot:", id]))
            .collect();
        let mut conn = self.conn.clone();
        let values: Vec<Option<String>> = self.timed(async { conn.mget(&keys).await }).await?;
        let mut found: Vec<(String, String)> = Vec::new();
        for (id, value) in robot_ids.iter().zip(values) {
            if let Some((node, _)) = value.as_deref().and_then(parse_presence) {
                found.push((id.to_string(), node.to_string()));
            }
        }
        let mut nodes: Vec<String> = found.iter().map(|(_, n)| n.clone()).collect();
        nodes.sort();
        nodes.dedup();
        let alive = self.alive(&nodes).await?;
        Ok(found
            .into_iter()
            .filter(|(_, node)| alive.contains(node))
            .collect())
    }

    /// Writes the presence of every robot connected here (after a lapse).
    pub async fn assert_presence(&self, robots: &[(String, ConnId)]) -> Result<(), ClusterError> {
        for chunk in robots.chunks(REASSERT_BATCH) {
            let mut pipe = redis::pipe();
            for (robot_id, conn) in chunk {
                // A robot that moved to another node meanwhile keeps its newer entry.
                pipe.cmd("EVAL")
                    .arg(SET_UNLESS_ELSEWHERE)
                    .arg(1)
                    .arg(self.key(&["robot:", robot_id]))
                    .arg(self.presence_value(conn))
                    .arg(format!("{}\n", self.node))
                    .ignore();
            }
            let mut conn = self.conn.clone();
            self.timed(pipe.query_async::<()>(&mut conn)).await?;
        }
        Ok(())
    }
}
