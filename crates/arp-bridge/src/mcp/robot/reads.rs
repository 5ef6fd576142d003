//! Reading a context source once (`resources/read`): robot-agent has no one-shot read, so
//! a read subscribes, takes the next update and unsubscribes, sharing the subscription with
//! reads of the same source under way and with the client's own subscription.

use serde_json::json;
use tokio::sync::oneshot;

use super::{Reply, Robot, RobotError};
use crate::jsonrpc;
use crate::mcp::limits::{MAX_PENDING, READ_TIMEOUT};
use signalling_protocol::arp::method;

impl Robot {
    /// The next update of context source `name`: subscribes (if no other
    /// read of it is under way), waits for one update, unsubscribes when
    /// the last reader is done. Subscribe and unsubscribe frames are
    /// queued under the router's lock, so they reach the robot in the
    /// order the readers come and go.
    pub(in crate::mcp) async fn read_context(&self, name: &str) -> Reply {
        let (update, subscribed) = {
            let mut router = self.router();
            if router.closed {
                return Err(RobotError::Closed);
            }
            // A source the client subscribed to is subscribed already.
            let first = router.reads.get(name).is_none_or(|r| r.readers == 0)
                && !router.subscriptions.contains(name);
            let subscribed = if first {
                if router.pending.len() >= MAX_PENDING {
                    return Err(RobotError::Busy);
                }
                let id = self.next_id();
                let frame = jsonrpc::request(
                    &json!(id),
                    method::SUBSCRIBE_CONTEXT,
                    json!({ "name": name }),
                )
                .to_string();
                if self.inner.to_robot.try_send(frame).is_err() {
                    return Err(RobotError::Busy);
                }
                let (tx, rx) = oneshot::channel();
                router.pending.insert(jsonrpc::id_key(&json!(id)), tx);
                Some(rx)
            } else {
                None
            };
            let reads = router.reads.entry(name.to_owned()).or_default();
            reads.readers += 1;
            let (tx, rx) = oneshot::channel();
            reads.waiters.push(tx);
            (rx, subscribed)
        };
        let _reader = ReadGuard {
            robot: self.clone(),
            name: name.to_owned(),
        };
        let wait = async {
            let mut update = update;
            if let Some(subscribed) = subscribed {
                tokio::select! {
                    reply = &mut update => return reply.unwrap_or(Err(RobotError::Closed)),
                    answer = subscribed => match answer {
                        Ok(Err(e)) => {
                            // No such source (or a refusal): every reader
                            // waiting on it learns so now.
                            self.fail_reads(name, &e);
                        }
                        Ok(Ok(_)) => {}
                        Err(_) => return Err(RobotError::Closed),
                    },
                }
            }
            update.await.unwrap_or(Err(RobotError::Closed))
        };
        tokio::time::timeout(READ_TIMEOUT, wait)
            .await
            .unwrap_or(Err(RobotError::Timeout(READ_TIMEOUT)))
    }

    fn fail_reads(&self, name: &str, e: &RobotError) {
        if let Some(reads) = self.router().reads.get_mut(name) {
            for waiter in reads.waiters.drain(..) {
                let _ = waiter.send(Err(e.clone()));
            }
        }
    }

    fn end_read(&self, name: &str) {
        let mut router = self.router();
        let Some(reads) = router.reads.get_mut(name) else {
            return;
        };
        reads.readers = reads.readers.saturating_sub(1);
        if reads.readers > 0 {
            return;
        }
        router.reads.remove(name);
        if !router.closed && !router.subscriptions.contains(name) {
            // Its answer is not awaited (an unknown id is ignored); if the
            // queue is full the updates go on and are ignored too.
            let id = self.next_id();
            let frame = jsonrpc::request(
                &json!(id),
                method::UNSUBSCRIBE_CONTEXT,
                json!({ "name": name }),
            );
            let _ = self.inner.to_robot.try_send(frame.to_string());
        }
    }
}

struct ReadGuard {
    robot: Robot,
    name: String,
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        self.robot.end_read(&self.name);
    }
}
