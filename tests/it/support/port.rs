//! Free loopback ports for the servers the tests start.

use std::net::TcpListener;

/// A port the kernel just handed out and released. Another process can
/// take it before the caller's server binds it, so a server that starts
/// on it retries on a new one when its bind fails.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}
