//! Thin: parse the command line, start telemetry, call the library.

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use hookgate::cli::{self, Cli, Command};
use hookgate::settings::Settings;

/// mimalloc rather than the C library's malloc, whose functions were a
/// tenth of the gate's CPU in a profile of fresh events on sqlite: 7% to
/// 15% less CPU per request, for 2 to 3 MiB more peak RSS at 256
/// connections (docs/BENCHMARKS.md, The overhead work). SQLite keeps the C
/// library's allocator. A heap profiler that hooks `malloc` by
/// `LD_PRELOAD` (heaptrack) sees only SQLite's allocations now.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    no_huge_pages();
    // A command line that does not parse is a usage error: 64, like a bad
    // configuration (clap's own default would be 2).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.use_stderr() {
                true => ExitCode::from(cli::EXIT_BAD_CONFIG),
                false => ExitCode::SUCCESS,
            };
        }
    };
    if matches!(
        cli.command,
        Some(
            Command::Check(_) | Command::Sign { .. } | Command::Keys { .. } | Command::Queue { .. }
        )
    ) {
        end_quietly_on_a_closed_stdout();
    }
    match &cli.command {
        Some(Command::Demo) => block_on(async {
            match hookgate::demo::run().await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("demo failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }),
        Some(Command::Echo { listen, status }) => block_on(async {
            tokio::select! {
                served = hookgate::echo::run(*listen, *status) => match served {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("echo: {e}");
                        ExitCode::FAILURE
                    }
                },
                () = shutdown_signal() => ExitCode::SUCCESS,
            }
        }),
        Some(Command::Check(_)) => configured(&cli, |settings, read| cli::check(&settings, read)),
        Some(Command::Sign {
            provider,
            body,
            id,
            private_key,
            ..
        }) => configured(&cli, |settings, _| {
            cli::sign(
                &settings,
                provider,
                body.as_deref(),
                id.as_deref(),
                private_key.as_deref(),
            )
        }),
        Some(Command::Keys { action, .. }) => {
            configured(&cli, |settings, _| block_on(cli::keys(&settings, action)))
        }
        Some(Command::Queue { action, .. }) => {
            configured(&cli, |settings, _| block_on(cli::queue(&settings, action)))
        }
        Some(Command::Run(_)) | None => configured(&cli, |settings, read| {
            match cli::refuse_without_providers(&settings, read) {
                Ok(()) => block_on(serve(settings)),
                Err(code) => code,
            }
        }),
    }
}

/// The one-shot commands print and exit: when their reader went away
/// (`hookgate queue list | head -3`) they end as Unix tools do, quietly,
/// instead of panicking in `println!`. Rust ignores SIGPIPE in every
/// program; the server keeps ignoring it (a peer that hangs up is an error
/// on that one socket), and so do `demo` and `echo`, which serve too.
fn end_quietly_on_a_closed_stdout() {
    // SAFETY: restoring a signal's default disposition, before any other
    // thread exists; no handler runs, no memory is touched.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Transparent huge pages off for the whole process, as mimalloc's
/// `allow_thp = 0` does. The `no_thp` build of mimalloc no longer asks for
/// them (its `madvise` made the gate 10 MiB larger at start on this
/// project's benchmark, docs/BENCHMARKS.md, The overhead work); on a host
/// whose THP mode is `always` the kernel would back 2 MiB-aligned spans
/// with huge pages unasked. That case was not measured.
fn no_huge_pages() {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: a process-wide flag with integer arguments, passed as the
    // `unsigned long`s the kernel reads; no memory is passed or touched. A
    // kernel without it answers EINVAL, and the process runs as before.
    unsafe {
        let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
        libc::prctl(libc::PR_SET_THP_DISABLE, on, unused, unused, unused);
    }
}

/// Runs `then` with the configuration and the file it was read from (when
/// one was); a configuration that does not validate exits 64 instead.
fn configured(cli: &Cli, then: impl FnOnce(Settings, Option<&Path>) -> ExitCode) -> ExitCode {
    match cli.settings() {
        Ok(settings) => {
            let (path, exists) = cli.config_file();
            then(settings, exists.then_some(path))
        }
        Err(code) => code,
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

async fn serve(settings: Settings) -> ExitCode {
    hookgate::telemetry::init();
    // Before the gate announces its address: a SIGTERM that came after the
    // announcement and before the handler would end the process at once,
    // with no graceful shutdown.
    let stopping = shutdown_signal();
    let running = match hookgate::start(settings).await {
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
