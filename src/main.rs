//! Thin: parse the command line, start telemetry, call the library.

use std::process::ExitCode;

use clap::Parser;
use hookgate::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match cli.settings() {
        Ok(s) => s,
        Err(code) => return code,
    };
    match &cli.command {
        Some(Command::Check) => return cli::check(&settings),
        Some(Command::Sign { provider, body, id }) => {
            return cli::sign(&settings, provider, body.as_deref(), id.as_deref());
        }
        _ => {}
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        match &cli.command {
            Some(Command::Keys { action }) => cli::keys(&settings, action).await,
            _ => serve(settings).await,
        }
    })
}

async fn serve(settings: hookgate::settings::Settings) -> ExitCode {
    hookgate::telemetry::init();
    let running = match hookgate::start(settings).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    shutdown_signal().await;
    tracing::info!("shutting down: finishing in-flight deliveries");
    running.shutdown().await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (a terminal).
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
