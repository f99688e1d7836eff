//! The commands that run on tokio, as functions that build the runtime and
//! block until the command is done: `main` calls these and polls no future
//! of the library's. An async function's body is compiled into every crate
//! that polls it, with all the generic code under it; awaited from `main`,
//! the gate's serving code (hyper's servers and client, the stores'
//! clients) was compiled twice, once for `main` and once for the library's
//! own callers (`hookgate demo`): about 1.4 MB of the binary's code
//! (`.text` 11.36 -> 9.97 MB, with `echo`'s server compiled once;
//! docs/BENCHMARKS.md, Memory, "The binary's code, compiled twice").

use std::net::SocketAddr;
use std::process::ExitCode;

use crate::settings::Settings;

/// `hookgate run`: serves until SIGTERM or SIGINT, then shuts down
/// gracefully.
pub fn serve(settings: Settings) -> ExitCode {
    block_on(async {
        crate::telemetry::init();
        // Before the gate announces its address: a SIGTERM that came after
        // the announcement and before the handler would end the process at
        // once, with no graceful shutdown.
        let stopping = shutdown_signal();
        let running = match crate::start(settings).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::FAILURE;
            }
        };
        stopping.await;
        tracing::info!("shutting down: finishing in-flight deliveries");
        running.shutdown().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

/// `hookgate demo`.
pub fn demo() -> ExitCode {
    block_on(async {
        match crate::demo::run().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// `hookgate echo`: serves until SIGTERM or SIGINT.
pub fn echo(listen: SocketAddr, status: u16) -> ExitCode {
    block_on(async {
        tokio::select! {
            served = crate::echo::run(listen, status) => match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("echo: {e}");
                    ExitCode::FAILURE
                }
            },
            () = shutdown_signal() => ExitCode::SUCCESS,
        }
    })
}

/// `hookgate keys`.
pub fn keys(settings: &Settings, action: &super::KeysAction) -> ExitCode {
    block_on(super::keys(settings, action))
}

/// `hookgate queue`.
pub fn queue(settings: &Settings, action: &super::QueueAction) -> ExitCode {
    block_on(super::queue(settings, action))
}

fn block_on(work: impl Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(work),
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (a terminal). Both handlers
/// are registered when this is called, not when it is first awaited.
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        match (term, interrupt) {
            (Ok(mut term), Ok(mut interrupt)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = interrupt.recv() => {}
                }
            }
            // Registering fails only without a signal driver; Ctrl-C still
            // works then.
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
