//! This node's messages to the others: a bounded queue that synchronous code (the relay)
//! fills without waiting, and one writer task that sends whatever has piled up as one
//! pipeline, one round trip for many frames. Frames for one node travel together in one
//! PUBLISH.

use std::sync::Arc;

use redis::Value;
use tokio::sync::oneshot;

use super::link::Publisher;
use super::message::{self, Control, FrameOut};
use super::resp::Outgoing;
use super::Cluster;
use crate::delivery::{ConnId, Kick};
use crate::shutdown::StopSignal;

/// Frames and commands waiting for the writer; past this, messages to peers are dropped
/// (counted) rather than growing memory while Redis is slow or away.
pub(super) const OUTBOX: usize = 65_536;

/// Deletes a key only while it still holds the given value (a newer owner keeps it).
pub(super) const DELETE_IF: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

/// Largest pipeline the writer sends at once.
const BATCH: usize = 512;

/// Largest PUBLISH payload of frames batched for one node (a bigger frame goes alone): well
/// under Redis's pub/sub output limits, and under glibc's default mmap threshold (128 KiB)
/// for the buffers both nodes' redis clients make of it. 256 KiB measured 2-4 % slower
/// cross-node with 6 KB frames (docs/benchmarks.md, "Several nodes").
pub(super) const BATCH_BYTES: usize = 64 * 1024;

pub(super) enum Op {
    Publish {
        channel: String,
        payload: Vec<u8>,
    },
    /// A relayed frame for a socket on `node`.
    Frame {
        node: Arc<str>,
        frame: FrameOut,
    },
    PresenceUp {
        robot_id: String,
        conn: ConnId,
        /// Told once the pipeline holding the write has been answered (dropped if it failed).
        written: Option<oneshot::Sender<()>>,
    },
    PresenceDown {
        robot_id: String,
        conn: ConnId,
    },
}

impl Cluster {
    /// The robot is now verified on this node: other nodes' sockets of it are replaced.
    /// The answer resolves once Redis holds the presence (or the write failed); None when
    /// Redis is known to be away, so there is nothing worth waiting for.
    pub fn presence_up(&self, robot_id: &str, conn: &ConnId) -> Option<oneshot::Receiver<()>> {
        let (written, answer) = oneshot::channel();
        self.enqueue(
            Op::PresenceUp {
                robot_id: robot_id.to_string(),
                conn: conn.clone(),
                written: Some(written),
            },
            "presence",
        );
        self.is_healthy().then_some(answer)
    }

    pub fn presence_down(&self, robot_id: &str, conn: &ConnId) {
        self.enqueue(
            Op::PresenceDown {
                robot_id: robot_id.to_string(),
                conn: conn.clone(),
            },
            "presence",
        );
    }

    pub(super) fn enqueue(&self, op: Op, kind: &'static str) {
        if self.try_enqueue(op) {
            self.metrics
                .cluster
                .messages
                .with_label_values(&["sent", kind])
                .inc();
        }
    }

    /// Queues `op` for the writer, or counts it dropped when the queue is full.
    fn try_enqueue(&self, op: Op) -> bool {
        let queued = self.outbox.try_send(op).is_ok();
        if !queued {
            self.metrics.cluster.dropped.inc();
        }
        queued
    }

    /// Queues a relayed frame for a socket on `node`: the received bytes, shared.
    pub fn send_frame(&self, node: Arc<str>, frame: FrameOut) {
        if self.try_enqueue(Op::Frame { node, frame }) {
            self.frames_sent.inc();
        }
    }

    /// Counts a relayed frame received from another node.
    pub fn count_received_frames(&self, frames: usize) {
        self.frames_received.inc_by(frames as u64);
    }

    /// Queues a control message for one node.
    pub fn send(&self, node: &str, control: &Control) {
        let payload = message::encode_control(&self.node, control);
        self.enqueue(
            Op::Publish {
                channel: self.node_channel(node),
                payload,
            },
            control.kind(),
        );
    }

    /// Queues a control message for every other node.
    pub fn broadcast(&self, control: &Control) {
        let payload = message::encode_control(&self.node, control);
        self.enqueue(
            Op::Publish {
                channel: self.broadcast_channel(),
                payload,
            },
            control.kind(),
        );
    }

    pub fn kick(&self, node: &str, conn: &ConnId, reason: Kick) {
        self.send(
            node,
            &Control::Kick {
                conn: conn.to_string(),
                reason,
            },
        );
    }

    /// Sends queued operations until stopped; what is queued at the stop is still sent
    /// (the last notices of a draining node).
    ///
    /// One write at a time: what comes while one awaits its answer goes out together
    /// next. Sending without waiting (up to 16 pipelines in flight) was measured and not
    /// kept: at light load it did not lower the cross-node p50 beyond the noise, and under
    /// load the smaller pipelines cost throughput (6 KB frames, 50 sessions: 0.63–0.69× same
    /// node against 1.2× with this batching; docs/benchmarks.md, "Several nodes").
    pub async fn run_writer(self: Arc<Self>, mut stop: StopSignal) {
        let Some(mut rx) = self.outbox_rx.lock().ok().and_then(|mut rx| rx.take()) else {
            return;
        };
        let mut publisher = Publisher::new(self.bus.clone());
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, BATCH) => {
                    if n == 0 {
                        return;
                    }
                }
                _ = stop.stopped() => {
                    while let Ok(op) = rx.try_recv() {
                        batch.push(op);
                        if batch.len() >= BATCH {
                            self.flush(&mut publisher, &mut batch).await;
                        }
                    }
                    self.flush(&mut publisher, &mut batch).await;
                    return;
                }
            }
            self.flush(&mut publisher, &mut batch).await;
        }
    }

    /// Publishes go out on the bus's own connection, written from the frames where they
    /// lie; presence writes, which answer, as one pipeline of the redis crate beside it.
    async fn flush(&self, publisher: &mut Publisher, batch: &mut Vec<Op>) {
        if batch.is_empty() {
            return;
        }
        let mut out = publisher.outgoing();
        let mut pipe = redis::pipe();
        let presence_ops = self.encode(batch, &mut out, &mut pipe);
        let publishes = out.commands();
        let mut conn = self.conn.clone();
        let (published, answered) = tokio::join!(
            async {
                match publishes {
                    0 => Ok(0),
                    _ => publisher.send(&out).await,
                }
            },
            async {
                match presence_ops {
                    0 => Ok(Vec::new()),
                    // Only the presence writes answer (the deletes are ignored), in order.
                    _ => pipe.query_async::<Vec<Value>>(&mut conn).await,
                }
            }
        );
        publisher.give_back(out);
        let mut ok = true;
        match published {
            Ok(0) => {}
            Ok(refused) => self.metrics.cluster.dropped.inc_by(refused as u64),
            Err(e) => {
                tracing::debug!(error = %e, lost = publishes, "redis publish failed");
                self.metrics.cluster.dropped.inc_by(publishes as u64);
                ok = false;
            }
        }
        match answered {
            Ok(values) => self.presence_written(batch, values),
            Err(e) => {
                tracing::debug!(error = %e, lost = presence_ops, "redis pipeline failed");
                self.metrics.cluster.dropped.inc_by(presence_ops as u64);
                ok = false;
            }
        }
        self.record(ok);
        batch.clear();
    }

    /// Writes the batch: publishes into `out`, presence writes into `pipe`; returns how
    /// many presence writes there are.
    fn encode<'a>(
        &self,
        batch: &'a [Op],
        out: &mut Outgoing<'a>,
        pipe: &mut redis::Pipeline,
    ) -> usize {
        let mut presence_ops = 0;
        // Frames queued one after another go out one PUBLISH per node; any other publish
        // ends the run first, so whatever a node receives keeps the order it was queued in.
        let mut run: Vec<(&str, Vec<&FrameOut>, usize)> = Vec::new();
        for op in batch {
            match op {
                Op::Frame { node, frame } => {
                    let at = match run.iter().position(|(to, ..)| *to == &**node) {
                        Some(at) => at,
                        None => {
                            run.push((&**node, Vec::new(), 1));
                            run.len() - 1
                        }
                    };
                    let (_, frames, bytes) = &mut run[at];
                    if *bytes + 4 + frame.encoded_len() > BATCH_BYTES && !frames.is_empty() {
                        self.publish_frames(out, node, frames);
                        frames.clear();
                        *bytes = 1;
                    }
                    frames.push(frame);
                    *bytes += 4 + frame.encoded_len();
                }
                Op::Publish { channel, payload } => {
                    for (node, frames, _) in run.drain(..) {
                        self.publish_frames(out, node, &frames);
                    }
                    out.command(&[b"PUBLISH", channel.as_bytes(), payload]);
                }
                Op::PresenceUp { robot_id, conn, .. } => {
                    presence_ops += 1;
                    pipe.cmd("SET")
                        .arg(self.key(&["robot:", robot_id]))
                        .arg(self.presence_value(conn))
                        .arg("GET");
                }
                Op::PresenceDown { robot_id, conn } => {
                    presence_ops += 1;
                    pipe.cmd("EVAL")
                        .arg(DELETE_IF)
                        .arg(1)
                        .arg(self.key(&["robot:", robot_id]))
                        .arg(self.presence_value(conn))
                        .ignore();
                }
            }
        }
        for (node, frames, _) in run.drain(..) {
            self.publish_frames(out, node, &frames);
        }
        presence_ops
    }

    /// The presence writes were answered, each with the value it replaced: a robot that was
    /// connected elsewhere has that socket replaced, and each login waiting is told.
    fn presence_written(&self, batch: &mut [Op], values: Vec<Value>) {
        let presence_writes = batch.iter_mut().filter_map(|op| match op {
            Op::PresenceUp { conn, written, .. } => Some((conn, written)),
            _ => None,
        });
        for ((conn, written), value) in presence_writes.zip(values) {
            if let Value::BulkString(old) = value {
                self.replace_elsewhere(conn, &old);
            }
            if let Some(written) = written.take() {
                let _ = written.send(());
            }
        }
    }

    /// One PUBLISH to `node`'s channel carrying `frames`, in order.
    fn publish_frames<'a>(&self, out: &mut Outgoing<'a>, node: &str, frames: &[&'a FrameOut]) {
        out.publish_frames(
            &[self.config.prefix.as_bytes(), b"node:", node.as_bytes()],
            frames,
        );
    }

    /// A robot verified here was connected elsewhere: that socket is replaced (4001).
    fn replace_elsewhere(&self, conn: &ConnId, old: &[u8]) {
        let Some((node, old_conn)) = std::str::from_utf8(old)
            .ok()
            .and_then(|v| v.split_once('\n'))
        else {
            return;
        };
        if node != &*self.node && old_conn != &**conn {
            self.kick(node, &ConnId::from(old_conn), Kick::Replaced);
        }
    }
}
