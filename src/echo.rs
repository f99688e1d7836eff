//! A tiny app to put behind the gate: it answers every request with a fixed
//! status and `{"ok":true}`, and hands each request to a callback.
//! `hookgate echo` prints what it receives; `hookgate demo` counts it.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// One request as the app received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Serves on `listener` until the task is dropped: each request goes to
/// `seen`, then gets `status` with `{"ok":true}`.
pub async fn serve(
    listener: TcpListener,
    status: StatusCode,
    seen: impl Fn(Received) + Send + Sync + 'static,
) {
    serve_to(listener, status, Arc::new(seen)).await;
}

/// [`serve`], compiled once for its callers (`hookgate echo`, `hookgate
/// demo`): generic, each would build a copy of hyper's servers of its own.
async fn serve_to(
    listener: TcpListener,
    status: StatusCode,
    seen: Arc<dyn Fn(Received) + Send + Sync>,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let seen = Arc::clone(&seen);
        let service = service_fn(move |req: Request<Incoming>| {
            let seen = Arc::clone(&seen);
            async move {
                let (head, body) = req.into_parts();
                let body = body.collect().await.map(|b| b.to_bytes());
                seen(Received {
                    method: head.method,
                    uri: head.uri,
                    headers: head.headers,
                    body: body.unwrap_or_default(),
                });
                let mut answer = Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}")));
                *answer.status_mut() = status;
                answer.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                Ok::<_, Infallible>(answer)
            }
        });
        tokio::spawn(
            auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .into_owned(),
        );
    }
}

/// `hookgate echo`: serves on `listen` and prints each request (method,
/// path, headers, body) on stdout until the process is stopped. The error
/// is a sentence for stderr.
pub async fn run(listen: SocketAddr, status: u16) -> Result<(), String> {
    let status = StatusCode::from_u16(status)
        .map_err(|_| format!("--status {status} is not an HTTP status"))?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!(
        "echo app on http://{addr}: answers {} with {{\"ok\":true}} and prints each request; Ctrl-C stops it",
        status.as_u16()
    );
    serve(listener, status, |r| {
        // A closed stdout must not stop the app answering.
        let _ = print(&mut std::io::stdout().lock(), &r);
    })
    .await;
    Ok(())
}

fn print(out: &mut impl Write, r: &Received) -> std::io::Result<()> {
    writeln!(out, "--- {} {} ({} bytes)", r.method, r.uri, r.body.len())?;
    for (name, value) in &r.headers {
        writeln!(out, "{name}: {}", String::from_utf8_lossy(value.as_bytes()))?;
    }
    writeln!(out)?;
    out.write_all(&r.body)?;
    if !r.body.ends_with(b"\n") {
        writeln!(out)?;
    }
    out.flush()
}
