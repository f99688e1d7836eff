//! An accepted connection's socket (beneath TLS, if any) as the server
//! writes to it: a write may wait on the client for so long, and a
//! connection dropped for it is reset.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_io_timeout::TimeoutWriter;

/// The most of an answer a connection's socket holds unsent
/// (`TCP_NOTSENT_LOWAT`): the kernel takes more only as the client reads.
/// A write that waits is then one that waits on the client, not on a send
/// buffer the kernel grew to megabytes. Webhook answers are far smaller.
const UNSENT_BYTES: u32 = 128 * 1024;

/// A connection's socket whose writes fail (`TimedOut`) once one has
/// waited `limit` for the client to take more of its answer
/// (`UNSENT_BYTES`); hyper then drops the connection. hyper's HTTP/1
/// server has no write timeout, so without this a client that asks for a
/// large answer and reads none of it would hold its connection slot, and
/// the answer, for as long as TCP keeps the connection. It is judged per
/// write, not per answer, as nginx's `send_timeout`: a slow reader is not
/// cut. The writer is boxed, since the timer it holds is not `Unpin`: one
/// allocation per connection, none per request.
///
/// Once a write has timed out, the connection closes with a reset
/// (`SO_LINGER` of zero), as nginx's `reset_timedout_connection`: a
/// plain close would leave what is still queued for that client in the
/// kernel, probing a window that stays shut, long after the gate let go.
/// That holds for the close's own writes too (TLS's `close_notify`,
/// HTTP/2's GOAWAY): a client that takes none of them for as long loses
/// the end of an answer that was otherwise whole.
pub(super) struct Sending(Pin<Box<TimeoutWriter<TcpStream>>>);

impl Sending {
    pub(super) fn new(stream: TcpStream, limit: Duration) -> Self {
        // Linux's option (the image's and the chart's target). Elsewhere the
        // kernel's send buffer alone bounds what is queued. A refusal leaves
        // the write timeout whole, only judged against a larger queue.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let _ = socket2::SockRef::from(&stream).set_tcp_notsent_lowat(UNSENT_BYTES);
        let mut stream = TimeoutWriter::new(stream);
        stream.set_timeout(Some(limit));
        Self(Box::pin(stream))
    }

    /// Passes a write's outcome on; a timeout first makes the connection's
    /// close a reset. Should that fail, the close is a plain one.
    fn stalled<T>(&self, outcome: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(e)) = &outcome
            && e.kind() == io::ErrorKind::TimedOut
        {
            let _ = self.0.get_ref().set_zero_linger();
        }
        outcome
    }
}

impl AsyncRead for Sending {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for Sending {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outcome = self.0.as_mut().poll_write(cx, buf);
        self.stalled(outcome)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let outcome = self.0.as_mut().poll_write_vectored(cx, bufs);
        self.stalled(outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = self.0.as_mut().poll_flush(cx);
        self.stalled(outcome)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = self.0.as_mut().poll_shutdown(cx);
        self.stalled(outcome)
    }
}
