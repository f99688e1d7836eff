//! Thin: parse the command line, call the library.

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
    // The commands that run on tokio are the library's blocking functions
    // (`cli::blocking`): `main` polls no future of the library's, which
    // would compile the gate's serving code a second time into the binary.
    match &cli.command {
        Some(Command::Demo) => cli::blocking::demo(),
        Some(Command::Echo { listen, status }) => cli::blocking::echo(*listen, *status),
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
            configured(&cli, |settings, _| cli::blocking::keys(&settings, action))
        }
        Some(Command::Queue { action, .. }) => {
            configured(&cli, |settings, _| cli::blocking::queue(&settings, action))
        }
        Some(Command::Run(_)) | None => configured(&cli, |settings, read| {
            match cli::refuse_without_providers(&settings, read) {
                Ok(()) => cli::blocking::serve(settings),
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
