//! The application every row talks to: reads the whole body and answers
//! 200 `{"ok":true}`. A plain hyper HTTP/1.1 server, as small as an app can
//! be, so that the rows differ only in what sits in front of it.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const ANSWER: &[u8] = br#"{"ok":true}"#;

/// Serves until the process is killed.
pub fn serve(listen: SocketAddr, threads: usize) -> std::io::Result<()> {
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(answer))
                    .await;
            });
        }
    })
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // An app reads what it is sent; a failed read still gets its answer.
    let _ = req.into_body().collect().await;
    let mut response = Response::new(Full::new(Bytes::from_static(ANSWER)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
