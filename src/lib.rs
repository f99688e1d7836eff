//! hookgate: a webhook gate that verifies, deduplicates and forwards
//! deliveries to an unmodified application.
#![forbid(unsafe_code)]

pub mod admin;
pub mod body;
pub mod cli;
pub mod config;
pub mod cores;
pub mod demo;
pub mod echo;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
mod json_string;
pub mod key;
pub mod metrics;
pub mod pipeline;
pub mod provider;
pub mod ratelimit;
pub mod relay;
pub mod route;
pub mod secret;
pub mod server;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::future::Either;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cores::Cores;
use crate::gate::Gate;
use crate::server::ConnLimits;
use crate::settings::{Mode, Settings};

/// Why the gate could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Telemetry(#[from] metrics::OtlpError),
    #[error("cannot start the threads that serve {addr}: {source}")]
    Cores {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running gate: its bound addresses and the means to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub gate: Arc<Gate>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The public listener's threads, one per core.
    cores: Cores,
}

impl Running {
    /// Stops accepting, lets in-flight deliveries finish within
    /// `server.shutdown_grace`, and returns when both listeners are closed.
    pub async fn shutdown(mut self) {
        let deadline = tokio::time::Instant::now() + self.gate.settings.server.shutdown_grace;
        let _ = self.stop.send(true);
        self.cores.stopped().await;
        for task in self.tasks {
            let _ = task.await;
        }
        // Marks not made yet get what is left of the grace: those of
        // deliveries already answered, and those being retried (the store
        // was down when their deliveries finished).
        let marks = self.gate.marks.pending();
        marks.close();
        if tokio::time::timeout_at(deadline, marks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                pending = marks.len(),
                "grace elapsed with marks still to make: an answered delivery's claims are released, a retried mark's expire with its lease"
            );
        }
        // Before the exporters stop: a delivery the grace cut off is logged,
        // counted and its span ended as its core's runtime drops it.
        self.cores.finish().await;
        // After the cores: the claims of the deliveries they dropped are
        // still tracked (`pipeline::held`), and so is one the store granted
        // while the grace ran out.
        let released = self.gate.release_inflight().await;
        if released > 0 {
            tracing::warn!(
                released,
                "grace elapsed: released the claims of unfinished deliveries"
            );
        }
        self.gate.metrics.shutdown().await;
        if let Some(traces) = &self.gate.traces {
            traces.shutdown().await;
        }
    }
}

/// Binds the configured listeners (port 0 picks a free port) and serves.
/// `hookgate run` (`cli::blocking::serve`), `hookgate demo` and the
/// integration tests all start the gate here.
pub async fn start(settings: Settings) -> Result<Running, StartError> {
    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })
    };
    let listen = settings.server.listen;
    let core_count = cores::serving(settings.server.max_connections);
    let publics = cores::bind(listen, core_count).map_err(|source| StartError::Bind {
        addr: listen,
        source,
    })?;
    let admin = bind(settings.server.admin_listen).await?;
    let limits = ConnLimits {
        header_read_timeout: settings.server.read_timeout,
        grace: settings.server.shutdown_grace,
        max_connections: settings.server.max_connections,
        max_header_bytes: settings.server.max_header_bytes,
    };
    let gate = Gate::build(settings).await?;
    let (stop, stopped) = watch::channel(false);
    let addr = publics[0].local_addr().map_err(|source| StartError::Bind {
        addr: listen,
        source,
    })?;
    let admin_addr = local_addr(&admin);

    let (tls, shutdown) = (
        gate.tls.as_ref().map(|cert| cert.acceptor()),
        stopped.clone(),
    );
    // Both listeners' handlers are of one type, so that the server (with
    // hyper's HTTP/1, HTTP/2 and `auto` servers under it) is compiled once
    // for both, not once for each. The admin answer's future is boxed:
    // hyper keeps room for an answer's future in every connection, and the
    // public connections' room is not to be sized by it.
    let handler = |admin: bool| {
        let gate = Arc::clone(&gate);
        move |req, conn| {
            let gate = Arc::clone(&gate);
            if admin {
                Either::Right(Box::pin(admin::handle(gate, req)))
            } else {
                Either::Left(pipeline::handle(gate, req, conn))
            }
        }
    };
    let public = handler(false);
    let serving = Cores::start(publics, move |core, listener| {
        server::serve(
            listener,
            tls.clone(),
            public.clone(),
            shutdown.clone(),
            limits.share(core, core_count),
        )
    })
    .map_err(|source| StartError::Cores { addr, source })?;
    let admin_task = tokio::spawn(server::serve(admin, None, handler(true), stopped, limits));
    let mut tasks = vec![admin_task];
    if gate
        .settings
        .providers
        .iter()
        .any(|p| p.mode == Mode::Queue)
    {
        tasks.push(tokio::spawn(relay::run(
            Arc::clone(&gate),
            stop.subscribe(),
        )));
    }
    tracing::info!(%addr, %admin_addr, backend = gate.store.backend_name(), "hookgate listening");
    Ok(Running {
        addr,
        admin_addr,
        gate,
        stop,
        tasks,
        cores: serving,
    })
}

fn local_addr(listener: &TcpListener) -> SocketAddr {
    listener
        .local_addr()
        .expect("a bound listener has a local address")
}
