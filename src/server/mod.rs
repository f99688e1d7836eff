//! Listeners: the accept loop, HTTP/1.1 and HTTP/2 on one port, and
//! graceful shutdown.

mod idle;
mod send;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{Service, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use self::idle::{Counting, Streams};
use self::send::Sending;
use crate::body::{BoxError, ProxyBody};

/// Limits applied to every connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// How long a client may take to send the request head.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get once shutdown starts.
    pub grace: Duration,
    /// Connections served at once; further ones wait in the backlog.
    pub max_connections: usize,
    /// The most a request head may take (HTTP/1 buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
}

impl ConnLimits {
    /// Core `core`'s share (1-based, of `cores`) of the connection limit:
    /// the cores' shares add up to `max_connections`. A shared count would
    /// not do: a core waiting to accept holds a slot that a connection
    /// queued at another core's listener cannot use.
    pub fn share(self, core: usize, cores: usize) -> Self {
        let cores = cores.max(1);
        let extra = usize::from(core <= self.max_connections % cores);
        Self {
            max_connections: self.max_connections / cores + extra,
            ..self
        }
    }

    /// How long a write may wait on a client that takes none of it: two
    /// read timeouts, the HTTP/2 watch's rule for an answer (`idle`), and
    /// at most a day (a timer past tokio's range would panic).
    fn send_timeout(self) -> Duration {
        let stalled = u32::try_from(idle::STALLED).unwrap_or(u32::MAX);
        self.header_read_timeout
            .saturating_mul(stalled)
            .min(Duration::from_secs(24 * 3600))
    }
}

/// Who is on the other end of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Conn {
    pub peer: SocketAddr,
    /// Whether the connection came in over TLS (`X-Forwarded-Proto`).
    pub tls: bool,
}

/// How connections are served. hyper-util's `auto` tells HTTP/1 from
/// HTTP/2 by reading the first 24 bytes itself and handing them to hyper as
/// a read of their own; hyper then reserves its next 8 KiB read on top of
/// them, so the connection's first read buffer is 16 KiB. And a task that
/// may serve either version over plain TCP or TLS is sized for the largest
/// state of all four. So a connection whose first bytes (or TLS's ALPN)
/// already say HTTP/1 goes to hyper's HTTP/1 server directly, in a task
/// sized for it, and `auto`, boxed, serves the rest: HTTP/2, and a client
/// whose first bytes so far are a part of HTTP/2's preface. At 256
/// connections: peak heap 14.1 -> 12.0 MB, peak RSS 0.4 to 1.7 MiB lower
/// (docs/BENCHMARKS.md, Memory).
///
/// Both HTTP/1 servers allow a half-close. By default hyper reads on once
/// a request's body is in, to notice a client that leaves before its
/// answer; that read reserves a new 8 KiB buffer for every request, at
/// once, while the request's head and body (slices of the first) still
/// hold the first, until the delivery copies them off
/// (`crate::pipeline::read::unshare`). With `half_close` nothing is read
/// until the answer is written, and the next request's read reuses the
/// first buffer. A client may shut its side after the request and still
/// get the answer; one that has left is found only once its answer is
/// written (by that write failing, or the read after it). Nothing is lost
/// by that: a delivery runs to its end in a task of its own whether or not
/// its sender waits (`crate::pipeline`). A passthrough request, which is
/// not spawned, now runs to the app's answer too instead of being dropped
/// when its client leaves, and a connection whose client has left keeps
/// its `server.max_connections` slot until its answer is written.
struct Protocols {
    http1: http1::Builder,
    auto: auto::Builder<TokioExecutor>,
    /// How long a connection served by `auto` may go without a request.
    first_request: Duration,
}

/// Serves `handler` on `listener` (over TLS when an acceptor is given)
/// until `shutdown` flips, then stops accepting and gives open connections
/// `grace` to finish.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: F,
    mut shutdown: watch::Receiver<bool>,
    limits: ConnLimits,
) where
    F: Fn(Request<Incoming>, Conn) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let protocols = Arc::new(Protocols::new(limits));
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        // At the connection limit, stop accepting: the kernel's backlog
        // holds the rest, which is gentler than accepting and dropping.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            _ = shutdown.changed() => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let conn = Conn { peer, tls: tls.is_some() };
                let handler = handler.clone();
                let service = service_fn(move |req| {
                    // The handler's future is made inside the block: one
                    // made outside and awaited inside would be held twice
                    // in hyper's per-connection state.
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(req, conn).await) }
                });
                let protocols = Arc::clone(&protocols);
                let watcher = graceful.watcher();
                // Two spawns, so that a plain connection's task is not sized
                // for a TLS one's state.
                match tls.clone() {
                    None => {
                        let mut stopping = shutdown.clone();
                        let read_timeout = limits.header_read_timeout;
                        spawn_connection(peer, slot, async move {
                            // A client silent for as long as a head may take
                            // is cut off, as one whose head never ends is;
                            // one still silent at shutdown is let go.
                            let first = tokio::time::timeout(read_timeout, speaks_http1(&stream));
                            let http1 = tokio::select! {
                                first = first => match first {
                                    Ok(http1) => http1,
                                    Err(_) => return Err("no request within the read timeout".into()),
                                },
                                _ = stopping.wait_for(|stop| *stop) => return Ok(()),
                            };
                            let io = Either::Left(Sending::new(stream, limits.send_timeout()));
                            protocols.serve(TokioIo::new(io), http1, service, watcher, stopping).await
                        });
                    }
                    Some(acceptor) => {
                        let stopping = shutdown.clone();
                        let handshake_timeout = limits.header_read_timeout;
                        spawn_connection(peer, slot, async move {
                            // A client that never finishes the handshake is
                            // cut off like one that never sends its head.
                            let stream = Sending::new(stream, limits.send_timeout());
                            let accepted =
                                tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await;
                            let stream = match accepted {
                                Ok(Ok(stream)) => stream,
                                Ok(Err(e)) => return Err(e.into()),
                                Err(_) => return Err("TLS handshake timed out".into()),
                            };
                            // HTTP/2 over TLS is negotiated by ALPN (RFC 9113,
                            // 3.2): without "h2", the client speaks HTTP/1.
                            let http1 = stream.get_ref().1.alpn_protocol() != Some(b"h2");
                            let io = Either::Right(Box::new(stream));
                            protocols.serve(TokioIo::new(io), http1, service, watcher, stopping).await
                        });
                    }
                }
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.grace) => {
            tracing::warn!("shutdown grace elapsed with connections still open");
        }
    }
}

/// Requests one HTTP/2 connection may have open at once (hyper's default
/// is 200). Each holds up to `server.max_body_bytes` while its body is read
/// and verified, so this is the multiple of that an HTTP/2 client can make
/// the gate hold on one connection slot, where an HTTP/1 client holds one
/// (all connections together: `server.max_body_bytes_in_flight`).
const MAX_STREAMS: u32 = 32;

impl Protocols {
    fn new(limits: ConnLimits) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_header_bytes)
            .half_close(true);
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_header_bytes)
            .half_close(true);
        auto.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
            .max_concurrent_streams(MAX_STREAMS);
        Self {
            http1,
            auto,
            first_request: limits.header_read_timeout,
        }
    }

    /// Serves one connection until it ends or the shutdown has drained it.
    /// hyper's HTTP/1 server times each head itself, the wait for the next
    /// one on a kept-alive connection included (so, after the wait for the
    /// first bytes, a first head may take up to twice `server.read_timeout`).
    /// Neither `auto`'s detection nor its HTTP/2 server times anything: a
    /// connection served by `auto` with no request open for `first_request`
    /// is closed (`idle`), or a client could hold its connection slot until
    /// shutdown with one request and silence.
    async fn serve<S>(
        &self,
        io: TokioIo<Stream>,
        http1: bool,
        service: S,
        watcher: Watcher,
        stopping: watch::Receiver<bool>,
    ) -> Result<(), BoxError>
    where
        S: Service<Request<Incoming>, Response = Response<ProxyBody>, Error = Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        if http1 {
            Ok(watcher
                .watch(self.http1.serve_connection(io, service))
                .await?)
        } else {
            let streams = Arc::new(Streams::default());
            let service = Counting::new(service, Arc::clone(&streams));
            // Boxed: its state would otherwise size every connection's task.
            let conn = Box::pin(self.auto.serve_connection(io, service).into_owned());
            // Boxed as a `Send` trait object here, where it is built: left
            // generic, proving it `Send` at the spawn trips rustc's
            // inference of higher-ranked lifetimes in async blocks ("one
            // type is more general than the other").
            let served: Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + '_>> = Box::pin(
                idle::serve(conn, &streams, self.first_request, watcher, stopping),
            );
            served.await
        }
    }
}

/// Whether the client speaks HTTP/1, told from its first bytes without
/// taking them off the socket: `false` once they are HTTP/2's whole preface
/// (h2c with prior knowledge), or when the client closed. While the bytes
/// so far are a part of the preface it waits for the rest; the caller's
/// timeout bounds that wait, which `auto`'s own detection does not
/// (hyper#3756): a client that sends nothing, or "PRI" and no more, would
/// hold its connection slot until shutdown.
async fn speaks_http1(stream: &TcpStream) -> bool {
    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut first = [0; PREFACE.len()];
    loop {
        match stream.peek(&mut first).await {
            Ok(0) | Err(_) => return false,
            Ok(n) if first[..n] != PREFACE[..n] => return true,
            Ok(n) if n == PREFACE.len() => return false,
            // Peeking again at once would return the same bytes; real
            // clients send the preface in one write, so this rarely runs.
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// A connection's stream, plain or TLS: one type, so that hyper's servers
/// (HTTP/1, HTTP/2 and `auto`'s) are compiled once for both, not once for
/// each (docs/BENCHMARKS.md, Memory, "The binary's code, compiled twice").
/// The TLS stream is boxed so that a plain connection's state is not sized
/// for rustls's: a plain connection holds 8 bytes more, a TLS one a second
/// allocation (the handshake's task still has room for the stream inline),
/// and reads and writes take one branch more.
type Stream = Either<Sending, Box<TlsStream<Sending>>>;

/// Runs one connection as a task of its own; its slot is free when it ends.
fn spawn_connection(
    peer: SocketAddr,
    slot: OwnedSemaphorePermit,
    served: impl Future<Output = Result<(), BoxError>> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(e) = served.await {
            tracing::debug!(error = %e, %peer, "connection ended with an error");
        }
        drop(slot);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What `speaks_http1` says of a client that sent `sent`; `None` while
    /// it still waits.
    async fn first_bytes(sent: &'static [u8]) -> Option<bool> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        client.write_all(sent).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let told = tokio::time::timeout(Duration::from_millis(300), speaks_http1(&server)).await;
        let mut left = vec![0; sent.len()];
        server.peek(&mut left).await.unwrap();
        assert_eq!(left, sent, "the first bytes were taken off the socket");
        told.ok()
    }

    #[tokio::test]
    async fn http1_is_told_from_the_first_bytes_without_taking_them() {
        assert_eq!(
            first_bytes(b"POST /webhooks/stripe HTTP/1.1\r\n").await,
            Some(true)
        );
        assert_eq!(first_bytes(b"GET / HTTP/1.0\r\n").await, Some(true));
        assert_eq!(
            first_bytes(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await,
            Some(false)
        );
        assert_eq!(
            first_bytes(b"P").await,
            None,
            "the preface's first byte: wait"
        );
        assert_eq!(
            first_bytes(b"PRI * HTTP/2").await,
            None,
            "a part of the preface: wait"
        );
        assert_eq!(first_bytes(b"PRI * HTTP/1.1\r\n").await, Some(true));
    }

    #[test]
    fn the_cores_shares_add_up_to_the_connection_limit() {
        let limits = |max_connections| ConnLimits {
            header_read_timeout: Duration::from_secs(1),
            grace: Duration::from_secs(1),
            max_connections,
            max_header_bytes: 1024,
        };
        for (max, cores) in [(1024, 2), (5, 2), (7, 3), (2, 2), (1, 1), (9, 4)] {
            let shares: Vec<usize> = (1..=cores)
                .map(|core| limits(max).share(core, cores).max_connections)
                .collect();
            assert_eq!(
                shares.iter().sum::<usize>(),
                max,
                "{max} over {cores}: {shares:?}"
            );
            assert!(shares.iter().all(|&s| s >= 1), "{shares:?}");
            let (least, most) = (shares.iter().min(), shares.iter().max());
            assert!(most.unwrap() - least.unwrap() <= 1, "{shares:?}");
        }
    }

    /// A server answering every request empty, on a free port; it stops
    /// when the sender says so.
    async fn server(
        header_read_timeout: Duration,
    ) -> (SocketAddr, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let limits = ConnLimits {
            header_read_timeout,
            grace: Duration::from_secs(30),
            max_connections: 4,
            max_header_bytes: 64 * 1024,
        };
        let handler = |_, _| async { Response::new(crate::body::empty()) };
        let served = tokio::spawn(serve(listener, None, handler, stopped, limits));
        (addr, stop, served)
    }

    /// Whether a server with a 200 ms read timeout closes a connection
    /// whose client sent `sent` and then nothing, and not before the
    /// timeout (a connection task that failed at once would close it too).
    async fn cut_off_after(sent: &[u8]) {
        let (addr, _stop, _served) = server(Duration::from_millis(200)).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(sent).await.unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0; 64];
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            // Whatever the server answers (a 408 to a part of a head), then EOF.
            loop {
                match client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "a client that sent {sent:?} kept its connection"
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(150),
            "a client that sent {sent:?} was cut off after {waited:?}, before the timeout"
        );
    }

    #[tokio::test]
    async fn a_silent_connection_is_cut_off_after_the_read_timeout() {
        cut_off_after(b"").await;
        cut_off_after(b"PRI * HTTP/2").await;
        cut_off_after(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n").await;
        // HTTP/2's preface and no request: `auto` and hyper's HTTP/2
        // server time nothing themselves.
        cut_off_after(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    }

    #[tokio::test]
    async fn http1_and_h2c_requests_are_answered() {
        let (addr, _stop, _served) = server(Duration::from_millis(400)).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0; 12];
        client.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");

        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        // Past the read timeout in all, each request within it of the last:
        // a connection that keeps asking stays open (an idle one is closed:
        // tests/it/slow_clients.rs).
        for _ in 0..4 {
            let request = Request::get("http://x/")
                .body(crate::body::empty())
                .unwrap();
            let answer = sender.send_request(request).await.unwrap();
            assert_eq!(answer.status(), 200);
            assert_eq!(answer.version(), http::Version::HTTP_2);
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    #[tokio::test]
    async fn a_silent_connection_does_not_hold_up_shutdown() {
        let (addr, stop, served) = server(Duration::from_secs(30)).await;
        let _silent = TcpStream::connect(addr).await.unwrap();
        // HTTP/2's preface and nothing more: served by `auto`, never asked.
        let mut preface_only = TcpStream::connect(addr).await.unwrap();
        preface_only
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("shutdown did not wait out the grace period")
            .unwrap();
    }
}
