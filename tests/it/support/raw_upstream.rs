//! An app that answers every request with fixed bytes written straight to
//! the socket, for answers hyper would never write: a body that breaks off
//! or stalls after a 2xx head.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// What the app does after writing its bytes.
#[derive(Clone, Copy, Debug)]
pub enum Then {
    /// Close the connection: a body shorter than announced breaks off.
    Close,
    /// Keep the connection open for this long, sending nothing more.
    Stall(Duration),
}

pub struct RawUpstream {
    pub addr: SocketAddr,
    calls: Arc<AtomicUsize>,
}

impl RawUpstream {
    /// Answers each request with `answer`, then does `then`.
    pub async fn start(answer: &'static [u8], then: Then) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    if read_request(&stream).await {
                        counter.fetch_add(1, Ordering::SeqCst);
                        answer_then(stream, answer, then).await;
                    }
                });
            }
        });
        Self { addr, calls }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests the app has read whole.
    pub fn count(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Reads one request: its head, then `Content-Length` bytes of body.
async fn read_request(stream: &TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return true;
            }
        }
        stream.readable().await.ok();
        match stream.try_read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return false,
        }
    }
}

async fn answer_then(mut stream: TcpStream, answer: &[u8], then: Then) {
    if stream.write_all(answer).await.is_err() {
        return;
    }
    match then {
        Then::Close => {
            let _ = stream.shutdown().await;
        }
        Then::Stall(d) => tokio::time::sleep(d).await,
    }
}
