//! Delivery on this node: each socket's bounded queue (its `Mailbox`), the shares senders
//! get of it, and kicks. Below the relay and the cluster: both name sockets by [`ConnId`]
//! and close them with a [`Kick`].

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use axum::extract::ws::Utf8Bytes;
use tokio::sync::Notify;

use crate::rate_limit::RateLimiter;

mod bus;
pub use bus::{Bus, LocalBus};

/// A socket's server-assigned id (the `connectionId` of its welcome).
pub type ConnId = Arc<str>;

/// A frame queued for a socket. Text is shared bytes: a relayed message is the frame that
/// was received (or one spliced copy of it), never copied again on its way out.
#[derive(Debug, Clone)]
pub enum Outbound {
    Text(Utf8Bytes),
    Ping,
}

impl Outbound {
    pub fn text(text: impl Into<Utf8Bytes>) -> Outbound {
        Outbound::Text(text.into())
    }
}

impl Outbound {
    /// Bytes it holds while queued.
    pub fn len(&self) -> usize {
        match self {
            Outbound::Text(text) => text.len(),
            Outbound::Ping => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A close frame the socket task asks its writer to end with: code and reason.
pub type CloseRequest = (u16, Cow<'static, str>);

/// What a socket's writer does next ([`QueueReceiver::next_for_writer`]).
#[derive(Debug)]
pub enum WriterNext {
    /// A frame to send.
    Frame(Outbound),
    /// The socket task asked the writer to end: with this close frame, after what is queued
    /// (bounded by the writer), or at once (None: nothing more can reach the peer).
    End(Option<CloseRequest>),
    /// Every sender is gone and the queue is drained.
    Closed,
}

/// Why the server closes a socket from outside its own task; crosses the bus between nodes
/// as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kick {
    /// A newer verified connection took over this robot id.
    Replaced,
    /// The robot's key or certificate was revoked, or the robot was deleted.
    Revoked,
    /// The client token was revoked.
    TokenRevoked,
    /// The socket did not drain its queue fast enough.
    SlowConsumer,
    Shutdown,
}

impl Kick {
    /// WebSocket close code and reason text.
    pub fn close_frame(self) -> (u16, &'static str) {
        match self {
            Kick::Replaced => (4001, "replaced by a newer connection"),
            Kick::Revoked => (4003, "credential revoked"),
            Kick::TokenRevoked => (4003, "token revoked"),
            Kick::SlowConsumer => (1008, "too slow to receive messages"),
            Kick::Shutdown => (1001, "server shutting down"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeliveryError {
    #[error("the receiving socket is gone")]
    Gone,
    #[error("the receiving socket's queue is full")]
    Full,
    /// The sender already has its fair share queued at this receiver, or sends more bytes
    /// per second than one sender may: the sender is refused, never the receiver.
    #[error("too much queued or sent for this receiver; slow down")]
    SenderThrottled,
}

/// Who a relayed frame counts against at its receiver.
#[derive(Debug, Clone, Copy)]
pub struct Sender<'a> {
    /// The share it is queued under: a client's subject (all its sockets together, on
    /// every node), or a robot's socket.
    pub share: &'a str,
    /// From a session that does not control the robot: it also counts against the pool
    /// that every viewer's frames share.
    pub viewer: bool,
}

/// How much a socket's queue may hold, in all, from any one sender and from viewers.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Frames queued in all.
    pub messages: usize,
    /// Bytes queued in all.
    pub bytes: usize,
    /// Frames and bytes one sender (share) may have queued here at once.
    pub share_messages: usize,
    pub share_bytes: usize,
    /// Frames and bytes all viewers together may have queued here at once.
    pub viewers_messages: usize,
    pub viewers_bytes: usize,
    /// Bytes per second one sender may send to this receiver (0: no limit).
    pub sender_bytes_per_sec: u64,
}

impl QueueLimits {
    /// Shares are a quarter of the queue, and viewers together get half: whoever floods,
    /// the controlling session keeps its quarter and the server its own room, so
    /// relayed frames never fill a queue (a sender over its limits is refused instead).
    pub fn new(messages: usize, bytes: usize, sender_bytes_per_sec: u64) -> QueueLimits {
        QueueLimits {
            messages: messages.max(1),
            bytes: bytes.max(1),
            share_messages: (messages / 4).max(1),
            share_bytes: (bytes / 4).max(1),
            viewers_messages: (messages / 2).max(1),
            viewers_bytes: (bytes / 2).max(1),
            sender_bytes_per_sec,
        }
    }
}

/// What one sender has queued at one receiver, and its byte budget there.
#[derive(Debug, Default)]
struct Share {
    messages: AtomicUsize,
    bytes: AtomicUsize,
    rate: Mutex<Option<RateLimiter>>,
}

impl Share {
    /// Takes room for one frame of `bytes` if it stays within `messages` and `max_bytes`.
    fn take(&self, bytes: usize, messages: usize, max_bytes: usize) -> bool {
        if self.messages.fetch_add(1, Ordering::Relaxed) + 1 > messages
            || self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > max_bytes
        {
            self.release(bytes);
            return false;
        }
        true
    }

    fn release(&self, bytes: usize) {
        self.messages.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A queued frame, with the accounting to undo when the writer takes it.
#[derive(Debug)]
struct Queued {
    frame: Outbound,
    bytes: usize,
    share: Option<Arc<Share>>,
    /// Counted in the viewers' pool.
    viewer: bool,
}

/// A socket's queue and its accounting, shared by the senders and the writer.
///
/// A plain deque behind a mutex rather than a channel: a channel reserves its first block
/// of slots up front (about 2 KiB here) in every socket, and most sockets sit idle. The
/// deque holds nothing until a frame comes and gives its room back once drained.
#[derive(Debug)]
struct QueueState {
    limits: QueueLimits,
    bytes: AtomicUsize,
    shares: Mutex<HashMap<Arc<str>, Arc<Share>>>,
    /// What every viewer together has queued.
    viewers: Share,
    frames: Mutex<VecDeque<Queued>>,
    /// Wakes the writer: a frame came, or the last sender went away.
    ready: Notify,
    /// Live `Mailbox` handles; none left means the queue is closed once drained.
    senders: AtomicUsize,
    /// The writer is gone: nothing queued now would ever be sent.
    receiver_gone: AtomicBool,
    /// Why the socket is to close, once kicked; the first reason stays (a socket closed
    /// as revoked stays revoked). Here rather than in a watch channel: that costs about
    /// 300 bytes per socket, and most sockets are never kicked.
    kick: OnceLock<Kick>,
    /// Wakes the socket task when kicked.
    kicked: Notify,
    /// Frames of this socket refused on another node (over its share there): strikes the
    /// socket task counts at its next frame, as it counts a refusal made here.
    remote_strikes: AtomicUsize,
    /// How the writer is to end, once the socket task asked (see [`WriterNext::End`]), until
    /// the writer takes it. Here, where the writer already waits, rather than in a channel
    /// of its own: a oneshot is about 100 bytes more in every socket.
    writer_end: Mutex<Option<Option<CloseRequest>>>,
    /// The peer speaks Modulr's legacy flat dialect: the writer renders frames for it.
    flat: AtomicBool,
}

impl QueueState {
    fn release(&self, bytes: usize, share: Option<&Share>, viewer: bool) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        if let Some(share) = share {
            share.release(bytes);
        }
        if viewer {
            self.viewers.release(bytes);
        }
    }

    fn frames(&self) -> MutexGuard<'_, VecDeque<Queued>> {
        // No code panics while holding it; a poisoned deque is still a valid deque.
        self.frames.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pop(&self) -> Option<Queued> {
        let mut frames = self.frames();
        let queued = frames.pop_front();
        // A drained queue gives its room back: most sockets are idle robots, and even the
        // four slots of a first reply are about 250 bytes in each. A busy socket pays one
        // allocation per burst its writer drains, not per frame.
        if frames.is_empty() && frames.capacity() > 0 {
            *frames = VecDeque::new();
        }
        queued
    }
}

/// Past this many senders, shares with nothing queued are forgotten.
const SHARES_KEPT: usize = 32;

/// The sending half of a socket's queue and its kick switch.
pub struct Mailbox {
    accounting: Arc<QueueState>,
}

impl Clone for Mailbox {
    fn clone(&self) -> Mailbox {
        self.accounting.senders.fetch_add(1, Ordering::Relaxed);
        Mailbox {
            accounting: self.accounting.clone(),
        }
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        if self.accounting.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last one: the writer sends what is queued, then sees the end.
            self.accounting.ready.notify_one();
        }
    }
}

/// What the socket task reads.
pub struct MailboxReceiver {
    pub queue: QueueReceiver,
    pub kick: KickReceiver,
}

/// The socket task's side of the kick switch, and of the strikes other nodes report.
pub struct KickReceiver {
    accounting: Arc<QueueState>,
}

impl KickReceiver {
    /// The kick, if one came.
    pub fn get(&self) -> Option<Kick> {
        self.accounting.kick.get().copied()
    }

    /// Strikes earned on other nodes since the last call.
    pub fn take_remote_strikes(&self) -> usize {
        let strikes = &self.accounting.remote_strikes;
        // Read first: this runs for every frame, and almost always finds none.
        if strikes.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        strikes.swap(0, Ordering::Relaxed)
    }

    /// Resolves once kicked. Cancel-safe: a kick that comes between the check and the
    /// wait is kept by the notification as a permit.
    pub async fn kicked(&self) -> Kick {
        loop {
            if let Some(kick) = self.get() {
                return kick;
            }
            self.accounting.kicked.notified().await;
        }
    }
}

/// The receiving half of a socket's queue; taking a frame releases its accounting.
pub struct QueueReceiver {
    accounting: Arc<QueueState>,
}

impl QueueReceiver {
    /// The next frame; None once every `Mailbox` is gone and the queue is drained.
    /// Cancel-safe: a frame is only taken by the synchronous pop after the wake-up.
    pub async fn recv(&mut self) -> Option<Outbound> {
        match self.next(false).await {
            WriterNext::Frame(frame) => Some(frame),
            WriterNext::End(_) | WriterNext::Closed => None,
        }
    }

    pub fn try_recv(&mut self) -> Option<Outbound> {
        let queued = self.accounting.pop()?;
        Some(self.release(queued))
    }

    /// The writer's next step: the end the socket task asked for comes before anything
    /// still queued (the writer sends a bounded part of that itself), then frames, then
    /// the close of the queue. Cancel-safe, as [`QueueReceiver::recv`].
    pub async fn next_for_writer(&mut self) -> WriterNext {
        self.next(true).await
    }

    fn take_writer_end(&self) -> Option<Option<CloseRequest>> {
        self.accounting
            .writer_end
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The next frame, or the end (heeded only when `heed_end`), or the queue's close.
    async fn next(&mut self, heed_end: bool) -> WriterNext {
        loop {
            if heed_end {
                if let Some(end) = self.take_writer_end() {
                    return WriterNext::End(end);
                }
            }
            if let Some(queued) = self.accounting.pop() {
                return WriterNext::Frame(self.release(queued));
            }
            if self.accounting.senders.load(Ordering::Acquire) == 0 {
                // A frame queued just before the last sender left is still delivered.
                return match self.accounting.pop() {
                    Some(queued) => WriterNext::Frame(self.release(queued)),
                    None => WriterNext::Closed,
                };
            }
            // A notification sent since the checks above is kept as a permit: none is lost.
            self.accounting.ready.notified().await;
        }
    }

    /// Whether the peer speaks the legacy flat dialect ([`Mailbox::speaks_flat`]).
    pub fn flat(&self) -> bool {
        self.accounting.flat.load(Ordering::Relaxed)
    }

    fn release(&self, queued: Queued) -> Outbound {
        self.accounting
            .release(queued.bytes, queued.share.as_deref(), queued.viewer);
        queued.frame
    }
}

impl Drop for QueueReceiver {
    fn drop(&mut self) {
        self.accounting.receiver_gone.store(true, Ordering::Release);
        // What was queued is dropped now, not when the last sender lets go.
        let drained = std::mem::take(&mut *self.accounting.frames());
        for queued in drained {
            self.release(queued);
        }
    }
}

impl Mailbox {
    /// A bounded queue: a socket that cannot keep up is closed, never buffered without limit.
    pub fn new(limits: QueueLimits) -> (Mailbox, MailboxReceiver) {
        let accounting = Arc::new(QueueState {
            limits,
            bytes: AtomicUsize::new(0),
            shares: Mutex::new(HashMap::new()),
            viewers: Share::default(),
            frames: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            senders: AtomicUsize::new(1),
            receiver_gone: AtomicBool::new(false),
            kick: OnceLock::new(),
            kicked: Notify::new(),
            remote_strikes: AtomicUsize::new(0),
            writer_end: Mutex::new(None),
            flat: AtomicBool::new(false),
        });
        (
            Mailbox {
                accounting: accounting.clone(),
            },
            MailboxReceiver {
                queue: QueueReceiver {
                    accounting: accounting.clone(),
                },
                kick: KickReceiver { accounting },
            },
        )
    }

    /// Queues a frame from `from` (None: the server itself, never throttled). A relayed
    /// frame that does not fit is its sender's to slow down (`SenderThrottled`), never a
    /// reason to close the receiver; only the server's own frames find a queue `Full`.
    pub fn send(&self, from: Option<Sender<'_>>, frame: Outbound) -> Result<(), DeliveryError> {
        let bytes = frame.len();
        let limits = &self.accounting.limits;
        let share = match from {
            Some(sender) => Some(self.admit(sender.share, bytes)?),
            None => None,
        };
        let viewer = from.is_some_and(|sender| sender.viewer);
        if viewer
            && !self
                .accounting
                .viewers
                .take(bytes, limits.viewers_messages, limits.viewers_bytes)
        {
            if let Some(share) = &share {
                share.release(bytes);
            }
            return Err(DeliveryError::SenderThrottled);
        }
        let no_room = if from.is_some() {
            DeliveryError::SenderThrottled
        } else {
            DeliveryError::Full
        };
        let total = self.accounting.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if total > limits.bytes {
            self.accounting.release(bytes, share.as_deref(), viewer);
            return Err(no_room);
        }
        {
            let mut frames = self.accounting.frames();
            if self.accounting.receiver_gone.load(Ordering::Acquire) {
                drop(frames);
                self.accounting.release(bytes, share.as_deref(), viewer);
                return Err(DeliveryError::Gone);
            }
            if frames.len() >= limits.messages {
                drop(frames);
                self.accounting.release(bytes, share.as_deref(), viewer);
                return Err(no_room);
            }
            frames.push_back(Queued {
                frame,
                bytes,
                share,
                viewer,
            });
        }
        self.accounting.ready.notify_one();
        Ok(())
    }

    /// Asks the queue's writer to end (for the socket task that owns the writer): with
    /// `close` after what is queued, or at once without a close frame. The first end asked
    /// for stands.
    pub fn end_writer(&self, close: Option<CloseRequest>) {
        let mut end = self
            .accounting
            .writer_end
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if end.is_none() {
            *end = Some(close);
            drop(end);
            self.accounting.ready.notify_one();
        }
    }

    /// The peer speaks the legacy flat dialect: from now on its writer renders frames flat.
    pub fn speaks_flat(&self) {
        self.accounting.flat.store(true, Ordering::Relaxed);
    }

    /// Checks and takes a sender's share for one frame of `bytes`.
    fn admit(&self, sender: &str, bytes: usize) -> Result<Arc<Share>, DeliveryError> {
        let limits = &self.accounting.limits;
        let share = {
            let mut shares = self
                .accounting
                .shares
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if shares.len() >= SHARES_KEPT && !shares.contains_key(sender) {
                shares.retain(|_, s| s.messages.load(Ordering::Relaxed) > 0);
            }
            match shares.get(sender) {
                Some(share) => share.clone(),
                None => shares.entry(Arc::from(sender)).or_default().clone(),
            }
        };
        if share.messages.load(Ordering::Relaxed) + 1 > limits.share_messages
            || share.bytes.load(Ordering::Relaxed) + bytes > limits.share_bytes
        {
            return Err(DeliveryError::SenderThrottled);
        }
        if limits.sender_bytes_per_sec > 0 {
            let now = Instant::now();
            let mut rate = share.rate.lock().unwrap_or_else(|p| p.into_inner());
            let bucket = rate.get_or_insert_with(|| {
                RateLimiter::new(
                    limits.sender_bytes_per_sec,
                    limits.sender_bytes_per_sec,
                    now,
                )
            });
            if !bucket.allow_cost(now, bytes) {
                return Err(DeliveryError::SenderThrottled);
            }
        }
        share.messages.fetch_add(1, Ordering::Relaxed);
        share.bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(share)
    }

    fn strike(&self) {
        self.accounting
            .remote_strikes
            .fetch_add(1, Ordering::Relaxed);
    }

    fn kick(&self, reason: Kick) {
        // The first reason wins: a socket closed as revoked stays revoked.
        if self.accounting.kick.set(reason).is_ok() {
            self.accounting.kicked.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of the controlling session (or a robot) under `share`.
    fn by(share: &str) -> Option<Sender<'_>> {
        Some(Sender {
            share,
            viewer: false,
        })
    }

    fn viewer(share: &str) -> Option<Sender<'_>> {
        Some(Sender {
            share,
            viewer: true,
        })
    }

    fn text(s: &str) -> Outbound {
        Outbound::Text(s.into())
    }

    fn recv_text(rx: &mut MailboxReceiver) -> Option<String> {
        match rx.queue.try_recv()? {
            Outbound::Text(t) => Some(t.to_string()),
            Outbound::Ping => None,
        }
    }

    #[test]
    fn full_queue_is_reported_not_buffered() {
        let bus = LocalBus::default();
        let (mailbox, mut rx) = Mailbox::new(QueueLimits::new(1, 1024, 0));
        let id: ConnId = Arc::from("a");
        bus.attach(id.clone(), mailbox);
        assert_eq!(bus.deliver(None, &id, text("1")), Ok(()));
        assert_eq!(bus.deliver(None, &id, text("2")), Err(DeliveryError::Full));
        assert_eq!(recv_text(&mut rx).as_deref(), Some("1"));
        bus.kick(&id, Kick::Revoked);
        bus.kick(&id, Kick::Shutdown);
        assert_eq!(rx.kick.get(), Some(Kick::Revoked));
        bus.detach(&id);
        assert_eq!(bus.deliver(None, &id, text("3")), Err(DeliveryError::Gone));
    }

    #[test]
    fn one_sender_cannot_take_more_than_its_share() {
        let (mailbox, mut rx) = Mailbox::new(QueueLimits::new(8, 1 << 20, 0));
        // A quarter of eight frames.
        assert_eq!(mailbox.send(by("flood"), text("f1")), Ok(()));
        assert_eq!(mailbox.send(by("flood"), text("f2")), Ok(()));
        assert_eq!(
            mailbox.send(by("flood"), text("f3")),
            Err(DeliveryError::SenderThrottled)
        );
        // The other sender and the server still get through.
        assert_eq!(mailbox.send(by("fair"), text("ok")), Ok(()));
        assert_eq!(mailbox.send(None, text("notice")), Ok(()));
        // Taking a frame gives the share back.
        assert_eq!(recv_text(&mut rx).as_deref(), Some("f1"));
        assert_eq!(mailbox.send(by("flood"), text("f3")), Ok(()));
    }

    /// Issue 29: viewers together take at most half the queue, the controller keeps its
    /// quarter, and relayed frames never find the queue full (their sender is refused,
    /// the receiver is not closed); only the server's own frames can.
    #[test]
    fn viewers_share_half_and_relayed_frames_never_fill_a_queue() {
        let (mailbox, mut rx) = Mailbox::new(QueueLimits::new(8, 1 << 20, 0));
        for (n, share) in ["v1", "v1", "v2", "v2"].into_iter().enumerate() {
            assert_eq!(mailbox.send(viewer(share), text("v")), Ok(()), "frame {n}");
        }
        // Half of eight frames: a third viewer finds the pool full.
        assert_eq!(
            mailbox.send(viewer("v3"), text("v")),
            Err(DeliveryError::SenderThrottled)
        );
        assert_eq!(mailbox.send(by("operator"), text("o1")), Ok(()));
        assert_eq!(mailbox.send(by("operator"), text("o2")), Ok(()));
        assert_eq!(mailbox.send(by("robot"), text("r1")), Ok(()));
        assert_eq!(mailbox.send(by("robot"), text("r2")), Ok(()));
        // Eight queued: a relayed frame is refused, a server frame finds it full.
        assert_eq!(
            mailbox.send(by("other"), text("x")),
            Err(DeliveryError::SenderThrottled)
        );
        assert_eq!(mailbox.send(None, text("x")), Err(DeliveryError::Full));
        // Taking a viewer's frame gives the pool its room back.
        assert_eq!(recv_text(&mut rx).as_deref(), Some("v"));
        assert_eq!(mailbox.send(viewer("v3"), text("v")), Ok(()));
    }

    #[test]
    fn shares_count_bytes_and_bytes_per_second() {
        let (mailbox, _rx) = Mailbox::new(QueueLimits::new(64, 4000, 0));
        let chunk = "x".repeat(600);
        assert_eq!(mailbox.send(by("big"), text(&chunk)), Ok(()));
        // 1000 bytes of share: a second 600-byte frame does not fit.
        assert_eq!(
            mailbox.send(by("big"), text(&chunk)),
            Err(DeliveryError::SenderThrottled)
        );
        let (rated, mut rated_rx) = Mailbox::new(QueueLimits::new(64, 1 << 20, 1000));
        assert_eq!(rated.send(by("big"), text(&chunk)), Ok(()));
        assert_eq!(recv_text(&mut rated_rx).as_deref(), Some(chunk.as_str()));
        // Nothing is queued, yet the second 600 bytes exceed 1000 bytes/s.
        assert_eq!(
            rated.send(by("big"), text(&chunk)),
            Err(DeliveryError::SenderThrottled)
        );
    }

    #[tokio::test]
    async fn the_writer_wakes_for_frames_and_ends_after_the_last_sender() {
        let (mailbox, mut rx) = Mailbox::new(QueueLimits::new(8, 1 << 20, 0));
        let sender = mailbox.clone();
        let waiting = tokio::spawn(async move { rx.queue.recv().await.map(|f| (f, rx)) });
        sender.send(None, text("wake")).expect("queued");
        let (frame, mut rx) = waiting.await.expect("task").expect("a frame");
        assert!(matches!(frame, Outbound::Text(t) if t == "wake"));
        // Queued before the last handle went away: still delivered, then the end.
        sender.send(None, text("last")).expect("queued");
        drop(sender);
        drop(mailbox);
        assert!(matches!(rx.queue.recv().await, Some(Outbound::Text(t)) if t == "last"));
        assert!(rx.queue.recv().await.is_none());
    }

    #[test]
    fn a_gone_writer_refuses_frames_and_frees_what_was_queued() {
        let (mailbox, rx) = Mailbox::new(QueueLimits::new(8, 1 << 20, 0));
        mailbox.send(by("sender"), text("queued")).expect("queued");
        drop(rx);
        assert_eq!(mailbox.accounting.bytes.load(Ordering::Relaxed), 0);
        assert_eq!(
            mailbox.send(by("sender"), text("late")),
            Err(DeliveryError::Gone)
        );
    }

    #[test]
    fn a_drained_queue_gives_its_room_back_even_after_one_frame() {
        let (mailbox, mut rx) = Mailbox::new(QueueLimits::new(1024, 1 << 20, 0));
        mailbox.send(None, text("welcome")).expect("queued");
        assert!(mailbox.accounting.frames().capacity() > 0);
        assert!(rx.queue.try_recv().is_some());
        assert_eq!(
            mailbox.accounting.frames().capacity(),
            0,
            "an idle socket's queue holds no room"
        );
    }

    #[tokio::test]
    async fn the_writer_hears_its_end_before_what_is_queued_and_only_the_first() {
        let (mailbox, mut rx) = Mailbox::new(QueueLimits::new(8, 1 << 20, 0));
        mailbox.send(None, text("queued")).expect("queued");
        mailbox.end_writer(Some((1000, "bye".into())));
        mailbox.end_writer(None);
        match rx.queue.next_for_writer().await {
            WriterNext::End(Some((1000, reason))) => assert_eq!(reason, "bye"),
            other => panic!("expected the close first, got {other:?}"),
        }
        // What was queued is still there for the writer to send before its close frame.
        assert!(matches!(rx.queue.try_recv(), Some(Outbound::Text(t)) if t == "queued"));
        drop(mailbox);
        assert!(matches!(
            rx.queue.next_for_writer().await,
            WriterNext::Closed
        ));
    }

    #[tokio::test]
    async fn a_waiting_writer_wakes_for_its_end() {
        let (mailbox, mut rx) = Mailbox::new(QueueLimits::new(8, 1 << 20, 0));
        let waiting = tokio::spawn(async move { rx.queue.next_for_writer().await });
        mailbox.end_writer(None);
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("task");
        assert!(matches!(next, WriterNext::End(None)));
    }

    #[test]
    fn a_drained_queue_gives_its_room_back_after_a_burst() {
        let (mailbox, mut rx) = Mailbox::new(QueueLimits::new(1024, 1 << 20, 0));
        assert_eq!(
            mailbox.accounting.frames().capacity(),
            0,
            "nothing reserved up front"
        );
        for _ in 0..100 {
            mailbox.send(None, text("x")).expect("queued");
        }
        while rx.queue.try_recv().is_some() {}
        assert_eq!(mailbox.accounting.frames().capacity(), 0);
        assert_eq!(mailbox.accounting.bytes.load(Ordering::Relaxed), 0);
    }
}
