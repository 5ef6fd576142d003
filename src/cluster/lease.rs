//! Each node's heartbeat lease (`alive:{node}`), the register of nodes, finding the nodes
//! that died and claiming their leftovers, leaving on drain, and the bus lag probe.

use std::sync::atomic::Ordering;

use redis::AsyncCommands;

use super::{Cluster, ClusterError, Control};

impl Cluster {
    /// Which of `nodes` have a live heartbeat lease.
    pub async fn alive(&self, nodes: &[String]) -> Result<Vec<String>, ClusterError> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for node in nodes {
            pipe.exists(self.key(&["alive:", node]));
        }
        let mut conn = self.conn.clone();
        let exists: Vec<bool> = self.timed(pipe.query_async(&mut conn)).await?;
        Ok(nodes
            .iter()
            .zip(exists)
            .filter(|(_, alive)| *alive)
            .map(|(n, _)| n.clone())
            .collect())
    }

    /// Renews this node's lease and registration. True when the lease had lapsed or Redis
    /// lost it (first beat, Redis restarted empty, a long stall): then everything this node
    /// keeps in Redis must be written again.
    pub async fn heartbeat(&self) -> Result<bool, ClusterError> {
        let ttl = self.config.node_ttl.as_millis() as u64;
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(self.key(&["alive:", &self.node]))
            .arg(crate::clock::now_unix())
            .arg("PX")
            .arg(ttl)
            .arg("GET");
        pipe.sadd(self.key(&["nodes"]), &*self.node).ignore();
        let mut conn = self.conn.clone();
        let (previous,): (Option<String>,) = self.timed(pipe.query_async(&mut conn)).await?;
        let dirty = self.dirty.swap(false, Ordering::Relaxed);
        let lapsed = previous.is_none() || dirty;
        Ok(lapsed)
    }

    /// Registered nodes whose lease expired, other than this one.
    ///
    /// `peers` are the nodes this node has sessions with: one that died is dead for this
    /// node too even once another survivor took it off the register (the first to notice
    /// does), which a `dead:` mark says. A node that left by draining is off the register
    /// without a mark: it ends its sessions itself and tells its peers.
    pub async fn dead_nodes(&self, peers: &[String]) -> Result<Vec<String>, ClusterError> {
        let mut conn = self.conn.clone();
        let registered: Vec<String> = self
            .timed(async { conn.smembers(self.key(&["nodes"])).await })
            .await?;
        let mut others: Vec<String> = registered
            .iter()
            .chain(peers)
            .filter(|n| **n != *self.node)
            .cloned()
            .collect();
        others.sort();
        others.dedup();
        let alive = self.alive(&others).await?;
        let silent: Vec<String> = others.into_iter().filter(|n| !alive.contains(n)).collect();
        let unregistered: Vec<&String> =
            silent.iter().filter(|n| !registered.contains(n)).collect();
        let marked: Vec<bool> = if unregistered.is_empty() {
            Vec::new()
        } else {
            let mut pipe = redis::pipe();
            for node in &unregistered {
                pipe.exists(self.key(&["dead:", node]));
            }
            self.timed(pipe.query_async(&mut conn)).await?
        };
        let dead_elsewhere: Vec<&String> = unregistered
            .into_iter()
            .zip(marked)
            .filter(|(_, marked)| *marked)
            .map(|(node, _)| node)
            .collect();
        Ok(silent
            .iter()
            .filter(|n| registered.contains(n) || dead_elsewhere.contains(n))
            .cloned()
            .collect())
    }

    /// Marks a dead node as dead (for the survivors that have sessions with it, see
    /// [`Cluster::dead_nodes`]) and takes it off the register; true for exactly one
    /// caller (that one ends the dead node's session records).
    pub async fn claim_dead(&self, node: &str) -> Result<bool, ClusterError> {
        // The mark outlives any survivor's next beats; a node that comes back under the
        // same id has a live lease again, which `dead_nodes` checks first.
        let mark_secs = (self.config.node_ttl.as_secs() * 6).max(60);
        let mut pipe = redis::pipe();
        pipe.set_ex(self.key(&["dead:", node]), 1, mark_secs)
            .ignore();
        pipe.srem(self.key(&["nodes"]), node);
        let mut conn = self.conn.clone();
        let (removed,): (i64,) = self.timed(pipe.query_async(&mut conn)).await?;
        Ok(removed == 1)
    }

    /// Draining: this node stops counting as alive, so no new session is routed here.
    pub async fn leave(&self) -> Result<(), ClusterError> {
        let mut pipe = redis::pipe();
        pipe.del(self.key(&["alive:", &self.node])).ignore();
        pipe.srem(self.key(&["nodes"]), &*self.node).ignore();
        let mut conn = self.conn.clone();
        self.timed(pipe.query_async::<()>(&mut conn)).await?;
        self.broadcast(&Control::NodeLeaving);
        Ok(())
    }

    /// Publishes a probe to this node's own channel; its arrival measures the bus lag.
    pub fn probe(&self) {
        self.send(
            &self.node.clone(),
            &Control::Probe {
                sent_unix_ms: crate::store::now_ms(),
            },
        );
    }

    pub fn observe_probe(&self, sent_unix_ms: i64) {
        let lag = (crate::store::now_ms() - sent_unix_ms).max(0) as f64 / 1000.0;
        self.metrics.cluster.bus_lag.observe(lag);
    }

    pub fn node_lost(&self) {
        self.metrics.cluster.nodes_lost.inc();
    }
}
