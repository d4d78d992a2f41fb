//! The connection layer under the router: an accept loop with a cap on open connections,
//! header and write timeouts on every connection, an explicit refusal of HTTP/2, and a
//! graceful shutdown bounded in time.
//!
//! A slow or stalled client must never hold resources forever: a client that sends its
//! headers too slowly is closed by hyper's header timeout (which also bounds how long an
//! idle keep-alive connection stays open), one that stops reading its answer is closed
//! once a write makes no progress for the write timeout (dropping the response, which
//! cancels its generation and frees its slot), and the body timeout is enforced where
//! the body is read (`routes`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::{Instant, Sleep};

/// The HTTP/2 connection preface a prior-knowledge client opens with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Connection-level limits (see `Config` for their meaning and defaults).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Longest wait for a complete request head (and for the next one on an idle
    /// keep-alive connection).
    pub header_timeout: Duration,
    /// Longest a write may make no progress before the connection is dropped.
    pub write_timeout: Duration,
    /// Most connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// How long a shutdown lets in-flight requests finish before cancelling them.
    pub shutdown_timeout: Duration,
    /// `SO_SNDBUF` of each connection, when set.
    pub send_buffer: Option<usize>,
}

/// Serves `app` on `listener` until `stop` resolves, then shuts down gracefully: no new
/// connections; idle ones close; in-flight requests get `limits.shutdown_timeout` to
/// finish, after which `cancel` is raised so that they end with an error (streams with
/// an error event and `[DONE]`), and connections still open a moment later are dropped.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
    cancel: watch::Sender<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let http = Arc::new(http);
    tokio::pin!(stop);
    loop {
        let (stream, _peer) = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    eprintln!("minfer serve: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        if let Some(n) = limits.send_buffer {
            let _ = socket2::SockRef::from(&stream).set_send_buffer_size(n);
        }
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tokio::spawn(refuse(stream, limits.max_connections));
            continue;
        };
        let (app, http, mut drain) = (app.clone(), Arc::clone(&http), drain_rx.clone());
        tokio::spawn(async move {
            let _permit = permit;
            // A shutdown does not wait for a client still sending its first bytes.
            let conn = tokio::select! {
                c = sniff(stream, limits) => c,
                _ = drain.wait_for(|d| *d) => None,
            };
            let Some(conn) = conn else {
                return;
            };
            let svc = TowerToHyperService::new(app);
            let conn = http.serve_connection(TokioIo::new(conn), svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = drain.wait_for(|d| *d) => {}
            }
            // Finishes the request in flight (if any), then closes.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = drain_tx.send(true);
    let all = limits.max_connections as u32;
    let closed = |d: Duration| tokio::time::timeout(d, slots.acquire_many(all));
    if closed(limits.shutdown_timeout).await.is_err() {
        let _ = cancel.send(true);
        // Long enough for cancelled answers to reach their clients; a client that does
        // not read them is dropped when the runtime stops.
        let _ = closed(Duration::from_secs(1)).await;
    }
}

/// Answers a connection beyond the cap with a 503 and closes it.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = format!(
        r#"{{"error":{{"message":"the server has {max} connections open, its limit (--max-connections); retry later","type":"server_overloaded","code":503}}}}"#
    );
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let answer = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        // Reading what the client sent lets the close be a FIN, not a reset that could
        // discard the answer before the client reads it.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}

/// Reads the first bytes of a connection to tell HTTP/1 from an HTTP/2 preface. An
/// HTTP/2 client is told, in HTTP/2, that this server speaks HTTP/1.1 only; anything
/// else is handed on with the bytes read so far replayed. `None`: nothing to serve.
async fn sniff(mut stream: TcpStream, limits: Limits) -> Option<Conn<TcpStream>> {
    let deadline = Instant::now() + limits.header_timeout;
    let mut head = Vec::with_capacity(H2_PREFACE.len());
    let mut buf = [0u8; 1024];
    while head.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&head) {
        let n = match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
            Ok(Ok(n)) => n,
        };
        head.extend_from_slice(&buf[..n]);
    }
    if head.starts_with(H2_PREFACE) {
        let _ = tokio::time::timeout(limits.write_timeout, stream.write_all(&goaway())).await;
        let _ = stream.shutdown().await;
        return None;
    }
    Some(Conn::new(stream, head, limits.write_timeout))
}

/// An empty HTTP/2 SETTINGS frame, then GOAWAY with HTTP_1_1_REQUIRED (RFC 9113 §7).
fn goaway() -> Vec<u8> {
    let debug = b"minfer serves HTTP/1.1 only";
    let mut out = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];
    let len = 8 + debug.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, 0x7, 0]);
    out.extend_from_slice(&[0, 0, 0, 0]); // stream 0
    out.extend_from_slice(&[0, 0, 0, 0]); // last stream id 0: nothing was processed
    out.extend_from_slice(&0xdu32.to_be_bytes()); // HTTP_1_1_REQUIRED
    out.extend_from_slice(debug);
    out
}

/// A connection's byte stream: replays the bytes `sniff` read, and fails a write that
/// makes no progress for `write_timeout` (a client that stopped reading), so that the
/// connection and its response are dropped instead of waiting forever.
pub(crate) struct Conn<T> {
    io: T,
    replay: Vec<u8>,
    replayed: usize,
    write_timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> Conn<T> {
    pub(crate) fn new(io: T, replay: Vec<u8>, write_timeout: Duration) -> Self {
        Conn {
            io,
            replay,
            replayed: 0,
            write_timeout,
            stalled: None,
        }
    }

    /// Called when the socket cannot take more bytes: pending until the stall has lasted
    /// `write_timeout`, then an error.
    fn stall<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let timeout = self.write_timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {timeout:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<R>(
        &mut self,
        r: Poll<io::Result<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<R>> {
        match r {
            Poll::Pending => self.stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Conn<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.replayed < this.replay.len() {
            let rest = &this.replay[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            if this.replayed == this.replay.len() {
                this.replay = Vec::new();
                this.replayed = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Conn<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progressed(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progressed(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.progressed(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.progressed(r, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_the_peer_never_reads_fails_after_the_write_timeout() {
        let (near, _far) = tokio::io::duplex(64);
        let mut c = Conn::new(near, Vec::new(), Duration::from_millis(100));
        let t0 = std::time::Instant::now();
        let chunk = [7u8; 16];
        let err = loop {
            if let Err(e) = c.write_all(&chunk).await {
                break e;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the write never failed"
            );
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_reading_is_not_cut_off() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut c = Conn::new(near, Vec::new(), Duration::from_millis(200));
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = [0u8; 16];
            while got < 1024 {
                // Each read comes well inside the write timeout.
                tokio::time::sleep(Duration::from_millis(20)).await;
                got += far.read(&mut buf).await.expect("read");
            }
        });
        c.write_all(&[1u8; 1024])
            .await
            .expect("a slow reader is served");
        reader.await.expect("reader");
    }

    #[tokio::test]
    async fn replayed_bytes_come_first() {
        let (near, mut far) = tokio::io::duplex(64);
        far.write_all(b"rest").await.expect("write");
        let mut c = Conn::new(near, b"sniffed ".to_vec(), Duration::from_secs(1));
        let mut out = vec![0u8; 12];
        c.read_exact(&mut out).await.expect("read");
        assert_eq!(&out, b"sniffed rest");
    }

    #[test]
    fn goaway_is_a_well_formed_http2_frame_pair() {
        let f = goaway();
        assert_eq!(&f[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0], "empty SETTINGS");
        let g = &f[9..];
        let len = (usize::from(g[0]) << 16) | (usize::from(g[1]) << 8) | usize::from(g[2]);
        assert_eq!(g[3], 7, "GOAWAY");
        assert_eq!(len, g.len() - 9);
        assert_eq!(&g[13..17], &0xdu32.to_be_bytes(), "HTTP_1_1_REQUIRED");
    }
}
