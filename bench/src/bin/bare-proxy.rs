//! The floor under the gate: a proxy built from the gate's own parts that
//! checks nothing. hyper's HTTP/1 server with half-close, hyper-util's
//! pooled client, a current-thread runtime on each of two threads (both
//! accepting on one listener), a cap of 32 calls to the app per thread
//! (the gate's upstream lanes at its default 64 connections), mimalloc
//! without huge pages. Each request's body is read whole and sent on, and
//! the app's answer read whole and returned, as the gate does.
//!
//! Not a gate: it takes a gate's command line (`run --config FILE`) and
//! reads `listen`, `admin_listen` and the upstream `url` from that file, so
//! that `hookgate-bench suite --candidate bench/target/release/bare-proxy`
//! runs it in the gate's rows. Its admin port answers 200 to everything
//! (the bench's readiness probe). The rows count its answers as errors,
//! since they lack the gate's `x-hookgate-*` headers; its CPU per request
//! and peak RSS are what it is for (docs/BENCHMARKS.md, Memory, "The
//! floor").

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const THREADS: usize = 2;
const CALLS_PER_THREAD: usize = 32;

type Upstream = Client<HttpConnector, Full<Bytes>>;

fn main() {
    let config = std::env::args()
        .next_back()
        .expect("usage: bare-proxy run --config FILE");
    let config = std::fs::read_to_string(&config).expect("the gate's config file");
    let value = |key: &str| {
        config
            .lines()
            .find_map(|line| line.trim().strip_prefix(key)?.trim().strip_prefix('='))
            .and_then(|value| value.trim().strip_prefix('"')?.strip_suffix('"'))
            .unwrap_or_else(|| panic!("no {key} = \"...\" in the config"))
            .to_owned()
    };
    let upstream: Uri = value("url").parse().expect("the upstream's url");
    let listener = bind(&value("listen"));
    let admin = bind(&value("admin_listen"));

    let threads: Vec<_> = (0..THREADS)
        .map(|index| {
            let listener = listener.try_clone().expect("a second handle");
            let admin = (index == 0).then(|| admin.try_clone().expect("a second handle"));
            let upstream = upstream.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(serve(listener, admin, upstream));
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a serving thread");
    }
}

fn bind(addr: &str) -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind(addr).expect("the address is free");
    listener.set_nonblocking(true).expect("non-blocking");
    listener
}

async fn serve(
    listener: std::net::TcpListener,
    admin: Option<std::net::TcpListener>,
    upstream: Uri,
) {
    if let Some(admin) = admin {
        tokio::spawn(serve_admin(TcpListener::from_std(admin).expect("tokio")));
    }
    let listener = TcpListener::from_std(listener).expect("tokio");
    let client: Upstream = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CALLS_PER_THREAD)
        .build_http();
    let slots = Arc::new(Semaphore::new(CALLS_PER_THREAD));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (client, slots, upstream) = (client.clone(), Arc::clone(&slots), upstream.clone());
        let service = service_fn(move |request| {
            forward(
                request,
                client.clone(),
                Arc::clone(&slots),
                upstream.clone(),
            )
        });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(TokioIo::new(stream), service),
        );
    }
}

async fn forward(
    request: Request<Incoming>,
    client: Upstream,
    slots: Arc<Semaphore>,
    upstream: Uri,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let _slot = slots.acquire_owned().await.expect("never closed");
    let mut uri = upstream.into_parts();
    uri.path_and_query = parts.uri.path_and_query().cloned();
    let mut out = Request::builder().method(parts.method);
    for (name, value) in parts.headers.iter().filter(|(name, _)| *name != "host") {
        out = out.header(name, value);
    }
    let out = match Uri::from_parts(uri).map(|uri| out.uri(uri).body(Full::new(body))) {
        Ok(Ok(out)) => out,
        _ => return Ok(status(StatusCode::BAD_REQUEST)),
    };
    let Ok(answer) = client.request(out).await else {
        return Ok(status(StatusCode::BAD_GATEWAY));
    };
    let (parts, body) = answer.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

fn status(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::default());
    *response.status_mut() = status;
    response
}

async fn serve_admin(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let ok =
            service_fn(|_| async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), ok),
        );
    }
}
