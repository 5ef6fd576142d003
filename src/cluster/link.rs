//! The bus's two plain connections to Redis: the writer's, which publishes (frames written
//! from where they lie, replies counted), and the node's one subscription (pushes read from
//! one reused buffer). Keys, scripts and locks go through the redis crate's connection.

use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use futures_util::FutureExt;
use redis::{ConnectionAddr, ConnectionInfo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::message::{decode, DecodeError, PeerMessage};
use super::resp::{self, Outgoing, Reply};
use super::{ClusterError, PRESENCE_WAIT};

/// Room made in the read buffer before each read: a whole batch (64 KiB) and more.
const READ_ROOM: usize = 128 * 1024;
/// A read buffer grown past this by a large message is given back once drained.
const KEEP_READ: usize = 1024 * 1024;
/// A framing buffer grown past this by a burst is not kept for the next write.
const KEEP_HEAD: usize = 1024 * 1024;
/// After a failed connect, writes fail at once for this long instead of each trying again.
const RETRY_AFTER: Duration = Duration::from_millis(200);

trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

struct Link {
    stream: Box<dyn Stream>,
    read: BytesMut,
}

impl Link {
    /// Connects and logs in as the redis crate would for the same URL (the database
    /// number does not matter to pub/sub).
    async fn connect(info: &ConnectionInfo) -> Result<Link, ClusterError> {
        let stream: Box<dyn Stream> = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let tcp = TcpStream::connect((host.as_str(), *port)).await?;
                // A small PUBLISH is never held back behind an unanswered one.
                tcp.set_nodelay(true)?;
                Box::new(tcp)
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
            _ => {
                return Err(ClusterError::Unsupported(
                    "only redis:// and unix addresses",
                ))
            }
        };
        let mut link = Link {
            stream,
            read: BytesMut::with_capacity(READ_ROOM),
        };
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            let mut auth = Outgoing::new(Vec::new());
            match settings.username() {
                Some(user) => auth.command(&[b"AUTH", user.as_bytes(), password.as_bytes()]),
                None => auth.command(&[b"AUTH", password.as_bytes()]),
            }
            link.write(&auth).await?;
            link.next_reply(|reply| match reply {
                Reply::Status(_) => Ok(()),
                other => Err(refused(&other)),
            })
            .await??;
        }
        Ok(link)
    }

    async fn write(&mut self, out: &Outgoing<'_>) -> Result<(), ClusterError> {
        let mut slices = out.io_slices();
        let mut left = &mut slices[..];
        while !left.is_empty() {
            let n = self.stream.write_vectored(left).await?;
            if n == 0 {
                return Err(ClusterError::Closed);
            }
            std::io::IoSlice::advance_slices(&mut left, n);
        }
        Ok(())
    }

    /// Whether the peer closed this link (or sent what nobody asked for) while it sat idle.
    /// Between two sends a publisher owes no reply, so anything readable means the link is
    /// dead: Redis restarted while this node had nothing to publish. Writing on it would
    /// lose the whole next batch (the first frames after a restart) to find that out.
    fn went_away(&mut self) -> bool {
        if !self.read.is_empty() {
            return true;
        }
        self.read.reserve(1);
        // Pending: nothing to read, the link is as good as it was.
        self.stream
            .read_buf(&mut self.read)
            .now_or_never()
            .is_some()
    }

    /// Reads until a whole reply is buffered, hands it to `read` and drops it.
    async fn next_reply<T>(
        &mut self,
        read: impl FnOnce(Reply<'_>) -> T,
    ) -> Result<T, ClusterError> {
        loop {
            if let Some((reply, used)) = resp::parse(&self.read)? {
                let out = read(reply);
                self.read.advance(used);
                if self.read.is_empty() && self.read.capacity() > KEEP_READ {
                    self.read = BytesMut::with_capacity(READ_ROOM);
                }
                return Ok(out);
            }
            self.read.reserve(READ_ROOM);
            if self.stream.read_buf(&mut self.read).await? == 0 {
                return Err(ClusterError::Closed);
            }
        }
    }
}

fn refused(reply: &Reply<'_>) -> ClusterError {
    match reply {
        Reply::Error(text) => ClusterError::Refused(String::from_utf8_lossy(text).into_owned()),
        _ => ClusterError::Resp(resp::RespError("unexpected reply")),
    }
}

/// The writer's connection for PUBLISH, made on first use and again after a failure.
pub struct Publisher {
    info: ConnectionInfo,
    link: Option<Link>,
    head: Vec<u8>,
    retry_at: Option<Instant>,
}

impl Publisher {
    pub fn new(info: ConnectionInfo) -> Publisher {
        Publisher {
            info,
            link: None,
            head: Vec::new(),
            retry_at: None,
        }
    }

    /// A cleared framing buffer for the next write (the last one's allocation).
    pub fn outgoing<'a>(&mut self) -> Outgoing<'a> {
        Outgoing::new(std::mem::take(&mut self.head))
    }

    pub fn give_back(&mut self, out: Outgoing<'_>) {
        let head = out.into_head();
        if head.capacity() <= KEEP_HEAD {
            self.head = head;
        }
    }

    /// Sends `out` and waits for every reply: how many commands Redis refused. An error
    /// means nothing is known of what arrived; the connection is made again next time.
    pub async fn send(&mut self, out: &Outgoing<'_>) -> Result<usize, ClusterError> {
        let result = tokio::time::timeout(PRESENCE_WAIT, self.send_on_link(out))
            .await
            .unwrap_or(Err(ClusterError::Timeout(PRESENCE_WAIT)));
        if result.is_err() {
            self.link = None;
        }
        result
    }

    async fn send_on_link(&mut self, out: &Outgoing<'_>) -> Result<usize, ClusterError> {
        if self.link.as_mut().is_some_and(Link::went_away) {
            tracing::debug!(
                "the publisher's link to redis was closed while idle; connecting again"
            );
            self.link = None;
        }
        let link = match &mut self.link {
            Some(link) => link,
            None => {
                if self.retry_at.is_some_and(|at| Instant::now() < at) {
                    return Err(ClusterError::Closed);
                }
                match Link::connect(&self.info).await {
                    Ok(link) => {
                        self.retry_at = None;
                        self.link.insert(link)
                    }
                    Err(e) => {
                        self.retry_at = Some(Instant::now() + RETRY_AFTER);
                        return Err(e);
                    }
                }
            }
        };
        link.write(out).await?;
        let mut refused = 0;
        for _ in 0..out.commands() {
            let error = link
                .next_reply(|reply| match reply {
                    Reply::Error(text) => Some(String::from_utf8_lossy(text).into_owned()),
                    _ => None,
                })
                .await?;
            if let Some(error) = error {
                tracing::debug!(%error, "redis refused a publish");
                refused += 1;
            }
        }
        Ok(refused)
    }
}

/// The node's subscription to its channels.
pub struct Subscription {
    link: Link,
}

impl Subscription {
    pub async fn open(
        info: &ConnectionInfo,
        channels: &[&[u8]],
    ) -> Result<Subscription, ClusterError> {
        let mut link = Link::connect(info).await?;
        let mut subscribe = Outgoing::new(Vec::new());
        let mut args: Vec<&[u8]> = vec![b"SUBSCRIBE"];
        args.extend_from_slice(channels);
        subscribe.command(&args);
        link.write(&subscribe).await?;
        for _ in channels {
            link.next_reply(|reply| match reply {
                Reply::Array(items) if items.first() == Some(&Reply::Bulk(Some(b"subscribe"))) => {
                    Ok(())
                }
                other => Err(refused(&other)),
            })
            .await??;
        }
        Ok(Subscription { link })
    }

    /// The next message published to the channels (or why it could not be read); an error
    /// when the subscription is gone.
    pub async fn next(&mut self) -> Result<Result<PeerMessage, DecodeError>, ClusterError> {
        loop {
            let message = self
                .link
                .next_reply(|reply| match reply {
                    Reply::Array(items) => match items.as_slice() {
                        [Reply::Bulk(Some(b"message")), _, Reply::Bulk(Some(payload))] => {
                            Ok(Some(decode(payload)))
                        }
                        // Confirmations and pongs.
                        _ => Ok(None),
                    },
                    other => Err(refused(&other)),
                })
                .await??;
            if let Some(message) = message {
                return Ok(message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;
    use tokio::net::TcpListener;

    /// Serves one PUBLISH as Redis would: its payload, answered `:1`.
    async fn serve_publish(stream: &mut TcpStream) -> Vec<u8> {
        let mut buf = BytesMut::new();
        loop {
            if let Some((command, _)) = resp::parse(&buf).expect("RESP") {
                let payload = match command {
                    Reply::Array(items) => match items.as_slice() {
                        [Reply::Bulk(Some(b"PUBLISH")), _, Reply::Bulk(Some(payload))] => {
                            payload.to_vec()
                        }
                        other => panic!("not a PUBLISH: {other:?}"),
                    },
                    other => panic!("not a command: {other:?}"),
                };
                stream.write_all(b":1\r\n").await.expect("answer");
                return payload;
            }
            assert!(stream.read_buf(&mut buf).await.expect("read") > 0, "closed");
        }
    }

    fn publish(payload: &[u8]) -> Outgoing<'_> {
        let mut out = Outgoing::new(Vec::new());
        out.command(&[b"PUBLISH", b"p:node:n1", payload]);
        out
    }

    #[tokio::test]
    async fn the_first_publish_after_redis_restarts_is_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let info = format!("redis://{}", listener.local_addr().expect("addr"))
            .into_connection_info()
            .expect("url");
        let mut publisher = Publisher::new(info);
        let first = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let payload = serve_publish(&mut stream).await;
            (listener, stream, payload)
        });
        assert_eq!(publisher.send(&publish(b"one")).await.expect("sent"), 0);
        let (listener, stream, payload) = first.await.expect("served");
        assert_eq!(payload, b"one");

        // Redis goes away while this node has nothing to publish, and comes back.
        drop(stream);
        let link = publisher.link.as_mut().expect("kept");
        let seen =
            tokio::time::timeout(Duration::from_secs(5), link.stream.read_buf(&mut link.read));
        assert_eq!(
            seen.await
                .expect("the close reaches the node")
                .expect("EOF"),
            0
        );
        let second = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            serve_publish(&mut stream).await
        });
        let sent = publisher.send(&publish(b"two")).await;
        assert_eq!(
            sent.expect("the first publish after the restart is not lost"),
            0
        );
        assert_eq!(second.await.expect("served"), b"two");
    }
}
