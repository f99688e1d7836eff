//! The floor under the gate: a proxy built from the gate's own parts that
//! checks nothing (docs/BENCHMARKS.md, Memory, "The floor").
//!
//! What it shares with the gate: a thread per core with a current-thread
//! runtime and its own `SO_REUSEPORT` listener (`hookgate::cores::bind`),
//! hyper's HTTP/1 server with half-close, hyper-util's pooled client with
//! `TCP_NODELAY`, each thread's share of 64 calls to the app at once (the
//! gate's upstream lanes at the default `upstream.max_connections`), the
//! hop-by-hop headers stripped both ways (`hookgate::upstream`), mimalloc
//! without huge pages. Each request's body is read whole and sent on, the
//! app's answer read whole and returned, as the gate does when nothing
//! breaks (an answer that breaks off is a 502 here).
//!
//! What it leaves out: everything the gate checks and records (the
//! signature, the key, the store, the log line, the metrics, a task per
//! delivery), its timeouts, limits, TLS and HTTP/2, and the
//! `PR_SET_THP_DISABLE` the gate sets at start (this matters only on a
//! host whose transparent huge pages are `always`).
//!
//! It takes a gate's command line (`run --config FILE`) and reads `listen`,
//! `admin_listen` and `[upstream]`'s `url` from the file that the bench
//! writes, so that `hookgate-bench suite --candidate` runs it in the gate's
//! rows; its admin port answers 200 to everything (the bench's readiness
//! probe). The rows count its answers as errors: they lack the gate's
//! `Hookgate-Result` header.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The gate's default `upstream.max_connections`.
const CALLS: usize = 64;

type Upstream = Client<HttpConnector, Full<Bytes>>;

struct Config {
    listen: SocketAddr,
    admin: SocketAddr,
    upstream: Uri,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = match args.as_slice() {
        [_, run, flag, path] if run == "run" && flag == "--config" => path,
        _ => {
            panic!("usage: bare-proxy run --config FILE (a gate's config, as the bench writes it)")
        }
    };
    let config = read_config(path);
    let cores = hookgate::cores::available();
    // `cores::bind` makes tokio listeners on the way, which need a runtime.
    let binding = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime");
    let listeners = {
        let _inside = binding.enter();
        hookgate::cores::bind(config.listen, cores).expect("cannot listen on the public port")
    };
    drop(binding);
    let admin = std::net::TcpListener::bind(config.admin).expect("cannot listen on the admin port");
    admin.set_nonblocking(true).expect("non-blocking");
    let mut admin = Some(admin);
    let calls = CALLS.div_ceil(cores);

    let serving: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let admin = admin.take();
            let upstream = config.upstream.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(serve(listener, admin, upstream, calls));
            })
        })
        .collect();
    for thread in serving {
        thread.join().expect("a serving thread");
    }
}

/// The three values from the file the bench writes (`[server]`, then
/// `[upstream]`); not a TOML parser.
fn read_config(path: &str) -> Config {
    let text = std::fs::read_to_string(path).expect("the gate's config file");
    let value = |section: &str, key: &str| {
        string_in(&text, section, key)
            .unwrap_or_else(|| panic!("no {section} {key} = \"...\" in {path}"))
    };
    Config {
        listen: value("[server]", "listen").parse().expect("server.listen"),
        admin: value("[server]", "admin_listen")
            .parse()
            .expect("server.admin_listen"),
        upstream: value("[upstream]", "url").parse().expect("upstream.url"),
    }
}

/// `key = "..."`'s string in `section`.
fn string_in(text: &str, section: &str, key: &str) -> Option<String> {
    let mut current = "";
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            current = line;
            continue;
        }
        let Some(rest) = line.strip_prefix(key) else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix('=') else {
            continue;
        };
        if current == section {
            let quoted = rest.trim().strip_prefix('"')?.strip_suffix('"')?;
            return Some(quoted.to_owned());
        }
    }
    None
}

async fn serve(
    listener: std::net::TcpListener,
    admin: Option<std::net::TcpListener>,
    upstream: Uri,
    calls: usize,
) {
    if let Some(admin) = admin {
        tokio::spawn(serve_admin(TcpListener::from_std(admin).expect("tokio")));
    }
    let listener = TcpListener::from_std(listener).expect("tokio");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(CALLS)
        .build(connector);
    let slots = Arc::new(Semaphore::new(calls));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of file descriptors, most likely: as the gate, wait a little.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
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
        let connection = http1::Builder::new()
            .half_close(true)
            .serve_connection(TokioIo::new(stream), service);
        tokio::spawn(connection);
    }
}

async fn forward(
    request: Request<Incoming>,
    client: Upstream,
    slots: Arc<Semaphore>,
    upstream: Uri,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let _slot = slots.acquire_owned().await.expect("never closed");
    // The bench's upstream URL has no path: the request's path is the path.
    let mut uri = upstream.into_parts();
    uri.path_and_query = parts.uri.path_and_query().cloned();
    let Ok(uri) = Uri::from_parts(uri) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    hookgate::upstream::strip_hop_by_hop(&mut parts.headers);
    parts.uri = uri;
    let Ok(answer) = client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    else {
        return Ok(status(StatusCode::BAD_GATEWAY));
    };
    let (mut parts, body) = answer.into_parts();
    let Ok(body) = body.collect().await else {
        return Ok(status(StatusCode::BAD_GATEWAY));
    };
    hookgate::upstream::strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Full::new(body.to_bytes())))
}

fn status(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::default());
    *response.status_mut() = status;
    response
}

async fn serve_admin(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let ok =
            service_fn(|_| async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) });
        tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), ok));
    }
}
