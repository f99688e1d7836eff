//! Thin: parse the command line, start telemetry, call the library.

use std::process::ExitCode;

use clap::Parser;
use hookgate::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Some(Command::Demo)) {
        return block_on(async {
            match hookgate::demo::run().await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("demo failed: {e}");
                    ExitCode::FAILURE
                }
            }
        });
    }
    let settings = match cli.settings() {
        Ok(s) => s,
        Err(code) => return code,
    };
    match &cli.command {
        Some(Command::Check) => cli::check(&settings),
        Some(Command::Sign {
            provider,
            body,
            id,
            private_key,
        }) => cli::sign(
            &settings,
            provider,
            body.as_deref(),
            id.as_deref(),
            private_key.as_deref(),
        ),
        Some(Command::Keys { action }) => block_on(cli::keys(&settings, action)),
        Some(Command::Queue { action }) => block_on(cli::queue(&settings, action)),
        Some(Command::Run | Command::Demo) | None => block_on(serve(settings)),
    }
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
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
