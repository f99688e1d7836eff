//! The gate's once-a-second housekeeping re-reads secret files (and TLS
//! certificate files) off the runtime: a read that blocks, as one on a
//! stalled network mount does, must not stall the deliveries sharing the
//! runtime's threads.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "whsec_housekeeping_test_secret";

/// A FIFO's `open` for reading blocks until a writer opens it: swapped in
/// for a secret file, it makes the next reload block for as long as this
/// test wants. On a current-thread runtime, a reload run on the runtime
/// would stop every other task, this test's included.
#[tokio::test]
async fn a_blocked_secret_file_read_does_not_stall_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("stripe-secret");
    std::fs::write(&secret, SECRET).unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"2s\"\n\
         [upstream]\nurl = \"http://127.0.0.1:9\"\n\
         [store]\nbackend = \"memory\"\n\
         [providers.stripe]\nscheme = \"stripe\"\npath = \"/webhooks/stripe\"\nsecrets = [\"file:{}\"]\n",
        secret.display()
    );
    let settings = hookgate::config::load(&hookgate::config::figment_from_str(&toml))
        .unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
    let gate = hookgate::start(settings).await.expect("gate starts");

    swap_in_fifo(dir.path(), &secret);
    let (opened, reload_blocked) = tokio::sync::oneshot::channel();
    let (go_on, told_to_go_on) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        // Returns once the reload has opened the FIFO; its read then waits
        // for this end to close.
        let mut fifo = OpenOptions::new().write(true).open(&secret).unwrap();
        let _ = opened.send(());
        // Were the runtime stalled, nobody would tell this thread to go
        // on: it gives up, so that the test fails instead of hanging.
        let told = told_to_go_on.recv_timeout(Duration::from_secs(10)).is_ok();
        fifo.write_all(SECRET.as_bytes()).unwrap();
        // A regular file again before the FIFO closes: the next reload
        // reads it without blocking.
        std::fs::write(secret.with_extension("new"), SECRET).unwrap();
        std::fs::rename(secret.with_extension("new"), &secret).unwrap();
        told
    });

    reload_blocked.await.expect("the writer thread reports");
    // The reload is blocked in its read: the gate answers all the same.
    let health = get(gate.admin_addr, "/healthz").await;
    let _ = go_on.send(());
    let told = tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    assert!(
        told,
        "the runtime stalled while a secret file's read was blocked"
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    gate.shutdown().await;
}

/// Replaces `path` with a FIFO, atomically.
fn swap_in_fifo(dir: &Path, path: &Path) {
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs (apt-get install coreutils)");
    assert!(made.success(), "mkfifo failed");
    std::fs::rename(&fifo, path).unwrap();
}

/// A plain HTTP/1.1 GET, the answer's head and body as text.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: gate\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}
