//! The public listener served by one current-thread runtime per core.
//!
//! Each core's thread has its own runtime and its own `SO_REUSEPORT`
//! listener on the public address; the kernel spreads new connections over
//! them. A connection, the delivery task it spawns and the upstream
//! connection that delivery uses (the upstream pool is per core too,
//! `crate::upstream`) stay on one thread: no work stealing, and no wake-up
//! that crosses to another worker between reading a request and answering
//! it. A single redis server gets a connection per core as well
//! (`crate::store::redis`), PostgreSQL a pool per core
//! (`crate::store::postgres`), and the core's log lines gather in a buffer
//! written out before the core waits (`crate::telemetry`). What the cores
//! share runs on the main runtime: the admin listener, the relay,
//! housekeeping, and the clients of sqlite and Redis Cluster;
//! the sqlite store's thread hands a batch's answers back through each
//! core's `Inbox`. (docs/BENCHMARKS.md, "The overhead work":
//! 0.73 of the CPU per forged request, 0.87 per duplicate and 0.85 per
//! fresh event on sqlite, against one work-stealing runtime.)
//!
//! A connection stays on the core that accepted it, as with nginx's and
//! Envoy's workers: a sender that keeps one HTTP/2 connection open uses
//! one core.

mod inbox;

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

pub use self::inbox::{Answer, Inbox};

thread_local! {
    /// Which core's thread this is: 1 to N on a core's thread, 0 elsewhere.
    static CORE: Cell<usize> = const { Cell::new(0) };
    /// The core's inbox, on a core's thread.
    static INBOX: RefCell<Option<Arc<Inbox>>> = const { RefCell::new(None) };
    /// Deliveries in flight on the core (`Delivering`), on a core's thread.
    static DELIVERIES: Cell<usize> = const { Cell::new(0) };
}

/// A delivery in flight on the calling core, counted until dropped; see
/// [`alone`]. Off the cores nothing is counted. A core's tasks never
/// leave its thread, so the count goes down on the thread it went up on.
pub struct Delivering {
    counted: bool,
}

impl Delivering {
    pub fn start() -> Self {
        let counted = current() != 0;
        if counted {
            DELIVERIES.with(|d| d.set(d.get() + 1));
        }
        Self { counted }
    }
}

impl Drop for Delivering {
    fn drop(&mut self) {
        if self.counted {
            DELIVERIES.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
}

/// Whether the caller is on a core with at most one delivery in flight:
/// its own, when the caller is a delivery. Only deliveries are counted: a
/// task of the core's that is not one (a mark's retry, a release after a
/// panic) sees the core alone beside one delivery. False off the cores.
pub fn alone() -> bool {
    current() != 0 && DELIVERIES.with(Cell::get) <= 1
}

/// The core whose thread this is: 1 to N on a core's thread, 0 on the main
/// runtime and anywhere else.
pub fn current() -> usize {
    CORE.with(Cell::get)
}

/// The calling core's inbox, where another thread leaves answers for its
/// tasks (see `Inbox`); `None` off the cores.
pub fn inbox() -> Option<Arc<Inbox>> {
    INBOX.with(|i| i.borrow().clone())
}

/// Makes the calling thread core `core`'s: each core's thread as it
/// starts, and tests of what is per core (the store conformance suite runs
/// the sqlite store's jobs as a lone delivery's on a core this way).
#[doc(hidden)]
pub fn become_core(core: usize) {
    CORE.with(|c| c.set(core));
}

/// Gives the calling thread `inbox` as its core's, for tests of answers
/// handed to a core (its courier, `Inbox::deliver`, is the test's to run).
#[cfg(test)]
pub fn use_inbox(inbox: Arc<Inbox>) {
    INBOX.with(|i| *i.borrow_mut() = Some(inbox));
}

/// How many cores this process may use (the cgroup's CPU quota counts),
/// read once: the per-core pools and lanes (`crate::upstream`,
/// `crate::store::redis`, `crate::store::postgres`) are sized by it, and a
/// core's index is at most it.
pub fn available() -> usize {
    static AVAILABLE: OnceLock<usize> = OnceLock::new();
    *AVAILABLE.get_or_init(|| thread::available_parallelism().map_or(1, |n| n.get()))
}

/// How many cores' threads serve the public port: one per core, each
/// serving at least one of `server.max_connections`.
pub fn serving(max_connections: usize) -> usize {
    available().min(max_connections.max(1))
}

/// One `T` for each core's thread and one (index 0) for every other
/// runtime: a core reaches only its own, so what it holds (a pool, a
/// connection and the task that drives it) stays on that core's thread.
pub struct PerCore<T>(Vec<T>);

impl<T> PerCore<T> {
    /// `make` once for every core and once for the rest; `make` is given
    /// the index it makes for (0: off the cores).
    pub fn new(make: impl FnMut(usize) -> T) -> Self {
        Self((0..=available()).map(make).collect())
    }

    /// Like `new`, stopping at the first `make` that fails; `make` is given
    /// the index it makes for (0: off the cores).
    pub fn try_new<E>(make: impl FnMut(usize) -> Result<T, E>) -> Result<Self, E> {
        (0..=available())
            .map(make)
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// The calling core's, or the shared one off the cores.
    pub fn get(&self) -> &T {
        self.0.get(current()).unwrap_or(&self.0[0])
    }
}

/// The runtime the gate was started on, captured where a client that every
/// core shares is made (a Redis Cluster connection).
/// Such a client's connection tasks are spawned on the runtime that makes
/// them; made from a core's runtime they would live on that core's thread
/// and stop serving the others when it stops, so they are made here.
pub struct MainRuntime(Option<Handle>);

impl MainRuntime {
    /// The current runtime, if there is one.
    pub fn capture() -> Self {
        Self(Handle::try_current().ok())
    }

    /// Runs `task` on the main runtime and waits for its output; without
    /// one captured, runs it where it is. `Err` with the reason when the
    /// runtime stopped or the task panicked before it finished.
    pub async fn run<F>(&self, task: F) -> Result<F::Output, String>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some(runtime) => runtime.spawn(task).await.map_err(|e| e.to_string()),
            None => Ok(task.await),
        }
    }
}

/// Binds `count` listeners on `addr` with `SO_REUSEPORT`; port 0 picks one
/// free port for all of them. A port that something already listens on is
/// refused (`AddrInUse`), as a plain bind would be: `SO_REUSEPORT` alone
/// would let a second gate of the same user join the first one's group and
/// take half of its connections.
pub fn bind(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    if addr.port() != 0 {
        // Two gates started at the same instant could both pass this and
        // share the port; one started beside a running gate cannot.
        drop(std::net::TcpListener::bind(addr)?);
    }
    let mut addr = addr;
    let mut listeners = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(1024)?;
        addr = listener.local_addr()?;
        listeners.push(listener.into_std()?);
    }
    Ok(listeners)
}

/// The cores' threads, serving.
pub struct Cores {
    stopped: Vec<oneshot::Receiver<()>>,
    /// Dropped when the gate has stopped (`finish`, or with the gate):
    /// each core's runtime, and the tasks still on it (marks being
    /// retried, deliveries whose sender hung up), ends then.
    keep: Vec<oneshot::Sender<()>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Cores {
    /// Starts one thread per listener; core `n` (1-based) runs
    /// `serve(n, listener)` on a current-thread runtime of its own.
    pub fn start<F, Fut>(listeners: Vec<std::net::TcpListener>, serve: F) -> io::Result<Self>
    where
        F: Fn(usize, TcpListener) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let mut cores = Self {
            stopped: Vec::with_capacity(listeners.len()),
            keep: Vec::with_capacity(listeners.len()),
            threads: Vec::with_capacity(listeners.len()),
        };
        for (index, listener) in listeners.into_iter().enumerate() {
            let core = index + 1;
            let (done, stopped) = oneshot::channel();
            let (keep, kept) = oneshot::channel::<()>();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                // The core's log lines, gathered while it worked, are
                // written out before it waits (`crate::telemetry`).
                .on_thread_park(crate::telemetry::flush_core_log)
                .build()?;
            let serve = serve.clone();
            let thread = thread::Builder::new()
                .name(format!("hookgate-core-{core}"))
                .spawn(move || {
                    become_core(core);
                    let inbox = Arc::new(Inbox::default());
                    INBOX.with(|i| *i.borrow_mut() = Some(Arc::clone(&inbox)));
                    runtime.block_on(async move {
                        tokio::spawn(inbox.deliver());
                        match TcpListener::from_std(listener) {
                            Ok(listener) => serve(core, listener).await,
                            Err(e) => {
                                tracing::error!(error = %e, core, "cannot serve on this core")
                            }
                        }
                        let _ = done.send(());
                        let _ = kept.await;
                    });
                    // A blocking task (hyper's DNS lookup of the app's host
                    // name) does not hold up the gate's exit for long.
                    runtime.shutdown_timeout(Duration::from_millis(500));
                    crate::telemetry::flush_core_log();
                })?;
            cores.stopped.push(stopped);
            cores.keep.push(keep);
            cores.threads.push(thread);
        }
        Ok(cores)
    }

    /// Resolves when every core has stopped serving (its listener closed,
    /// its connections drained or past the grace).
    pub async fn stopped(&mut self) {
        for stopped in self.stopped.drain(..) {
            let _ = stopped.await;
        }
    }

    /// Ends the cores' runtimes (what is left on them is dropped) and waits
    /// for their threads, so that what they held (the gate, its store) is
    /// let go before the process exits.
    pub async fn finish(&mut self) {
        self.keep.clear();
        let threads = std::mem::take(&mut self.threads);
        let joined = tokio::task::spawn_blocking(move || {
            for (index, thread) in threads.into_iter().enumerate() {
                if thread.join().is_err() {
                    tracing::error!(core = index + 1, "a core's thread ended in a panic");
                }
            }
        });
        let _ = joined.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn each_core_reaches_its_own_and_the_rest_share_one() {
        let mut made = 0;
        let per_core = PerCore::new(|_| {
            made += 1;
            made - 1
        });
        assert_eq!(made, available() + 1);
        assert_eq!(*per_core.get(), 0, "off the cores");
        thread::scope(|s| {
            for core in 1..=available() {
                let per_core = &per_core;
                s.spawn(move || {
                    become_core(core);
                    assert_eq!(*per_core.get(), core);
                });
            }
        });
    }

    #[test]
    fn a_task_run_on_the_main_runtime_runs_on_its_threads() {
        let main = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("the-main-runtime")
            .enable_all()
            .build()
            .unwrap();
        let captured = main.block_on(async { MainRuntime::capture() });
        let core = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ran_on = core
            .block_on(captured.run(async { thread::current().name().map(str::to_owned) }))
            .unwrap();
        assert_eq!(ran_on.as_deref(), Some("the-main-runtime"));

        // Without a runtime captured, the task runs where it is awaited.
        let none = MainRuntime::capture();
        assert_eq!(core.block_on(none.run(async { 7 })), Ok(7));

        // A stopped main runtime is an error, not a hang.
        drop(main);
        let err = core.block_on(captured.run(async { 7 })).unwrap_err();
        assert!(!err.is_empty());
    }

    // A tokio test: `bind` makes its sockets with tokio's `TcpSocket`.
    #[tokio::test]
    async fn the_cores_listeners_share_one_port_and_each_accepts() {
        let listeners = bind("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let addr = listeners[0].local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        for listener in &listeners {
            assert_eq!(listener.local_addr().unwrap(), addr);
        }
        // The kernel spreads connections over the group: each one that
        // connects is accepted by one of the listeners.
        for listener in &listeners {
            listener.set_nonblocking(true).unwrap();
        }
        let mut clients: Vec<_> = (0..16)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut accepted = 0;
        for listener in &listeners {
            while let Ok((mut server, _)) = listener.accept() {
                server.write_all(b"x").unwrap();
                accepted += 1;
            }
        }
        assert_eq!(accepted, clients.len());
        for client in &mut clients {
            let mut byte = [0; 1];
            client.read_exact(&mut byte).unwrap();
        }
    }

    #[tokio::test]
    async fn a_port_already_served_is_refused() {
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = plain.local_addr().unwrap();
        let err = bind(taken, 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");

        // Another gate's group on the port, which SO_REUSEPORT alone
        // would let this one join.
        let group = bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let served = group[0].local_addr().unwrap();
        let err = bind(served, 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
    }
}
