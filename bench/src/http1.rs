//! A minimal HTTP/1.1 client connection: writes pre-built request bytes and
//! reads one answer (`Content-Length`, chunked or close-delimited), keeping
//! the connection alive. No pipelining: one request at a time, like a
//! webhook sender's connection.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::requests::Expect;

const INITIAL_BUFFER: usize = 16 * 1024;
const MAX_BUFFER: usize = 4 * 1024 * 1024;
const MAX_HEADERS: usize = 48;

/// What came back for one request.
#[derive(Debug)]
pub struct Answer {
    /// The status and `Hookgate-Result` were the expected ones.
    pub as_expected: bool,
    pub status: u16,
    /// The server will close the connection: open a new one.
    pub close: bool,
}

pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    end: usize,
}

/// A parsed answer head.
struct Head {
    len: usize,
    status: u16,
    framing: Framing,
    close: bool,
    /// `Hookgate-Result` is the expected one (or none was expected).
    result_ok: bool,
}

/// How the body of an answer is delimited.
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: vec![0; INITIAL_BUFFER],
            end: 0,
        })
    }

    /// Writes `request` and reads the whole answer.
    pub async fn exchange(&mut self, request: &[u8], expect: Expect) -> io::Result<Answer> {
        self.stream.write_all(request).await?;
        self.end = 0;
        let Head {
            len: head_len,
            status,
            framing,
            close,
            result_ok,
        } = loop {
            if let Some(head) = parse_head(&self.buf[..self.end], expect)? {
                break head;
            }
            self.fill().await?;
        };
        let mut close = close;
        match framing {
            Framing::Length(n) => {
                while self.end < head_len + n {
                    self.fill().await?;
                }
                if self.end > head_len + n {
                    return Err(protocol("bytes after the answer"));
                }
            }
            Framing::Chunked => self.read_chunked(head_len).await?,
            Framing::UntilClose => {
                close = true;
                while self.read_more().await? > 0 {}
            }
        }
        Ok(Answer {
            as_expected: status == expect.status && result_ok,
            status,
            close,
        })
    }

    async fn read_chunked(&mut self, mut pos: usize) -> io::Result<()> {
        loop {
            match httparse::parse_chunk_size(&self.buf[pos..self.end]) {
                Ok(httparse::Status::Complete((consumed, 0))) => {
                    // No trailers expected: the terminating CRLF follows.
                    let end = pos + consumed + 2;
                    while self.end < end {
                        self.fill().await?;
                    }
                    return Ok(());
                }
                Ok(httparse::Status::Complete((consumed, size))) => {
                    let size = usize::try_from(size).map_err(|_| protocol("chunk too large"))?;
                    let next = pos + consumed + size + 2;
                    while self.end < next {
                        self.fill().await?;
                    }
                    pos = next;
                }
                Ok(httparse::Status::Partial) => self.fill().await?,
                Err(_) => return Err(protocol("bad chunk size")),
            }
        }
    }

    /// Reads more bytes; the peer closing here is an error.
    async fn fill(&mut self) -> io::Result<()> {
        if self.read_more().await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-answer",
            ));
        }
        Ok(())
    }

    async fn read_more(&mut self) -> io::Result<usize> {
        if self.end == self.buf.len() {
            if self.buf.len() >= MAX_BUFFER {
                return Err(protocol("answer too large"));
            }
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = self.stream.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n)
    }
}

/// Parses the head once it is complete.
fn parse_head(bytes: &[u8], expect: Expect) -> io::Result<Option<Head>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(protocol(&format!("bad answer head: {e}"))),
    };
    let status = response.code.unwrap_or(0);
    let mut framing = None;
    let mut close = response.version == Some(0);
    let mut result = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| protocol("bad content-length"))?;
            framing = Some(Framing::Length(n));
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if h.value.eq_ignore_ascii_case(b"chunked") {
                framing = Some(Framing::Chunked);
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = h.value.eq_ignore_ascii_case(b"close");
        } else if h.name.eq_ignore_ascii_case("hookgate-result") {
            result = Some(h.value);
        }
    }
    let framing = match framing {
        Some(f) => f,
        None if status < 200 || status == 204 || status == 304 => Framing::Length(0),
        None => Framing::UntilClose,
    };
    let result_ok = match expect.result {
        None => true,
        Some(want) => result == Some(want.as_bytes()),
    };
    Ok(Some(Head {
        len: head_len,
        status,
        framing,
        close,
        result_ok,
    }))
}

fn protocol(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect(result: Option<&'static str>) -> Expect {
        Expect {
            status: 200,
            result,
        }
    }

    #[test]
    fn heads_are_read_with_their_framing_and_verdict() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\nhookgate-result: duplicate\r\n\r\n{\"ok\":true}";
        let head = parse_head(answer, expect(Some("duplicate")))
            .unwrap()
            .unwrap();
        assert_eq!(
            (head.status, head.close, head.result_ok),
            (200, false, true)
        );
        assert!(matches!(head.framing, Framing::Length(11)));
        assert_eq!(answer.len() - head.len, 11);
        let head = parse_head(answer, expect(Some("forwarded")))
            .unwrap()
            .unwrap();
        assert!(!head.result_ok);
        assert!(parse_head(&answer[..20], expect(None)).unwrap().is_none());
    }

    #[tokio::test]
    async fn an_exchange_reads_chunked_and_keeps_the_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            for _ in 0..2 {
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
                )
                .await
                .unwrap();
            }
        });
        let mut conn = Conn::connect(addr).await.unwrap();
        for _ in 0..2 {
            let a = conn
                .exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", expect(None))
                .await
                .unwrap();
            assert!(a.as_expected && !a.close);
        }
    }
}
