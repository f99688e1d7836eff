//! Test support: the real gate, a recording upstream, real servers.

pub mod fixture;
pub mod gate;
pub mod http2;
pub mod port;
pub mod postgres_server;
pub mod raw_upstream;
pub mod redis_cluster;
pub mod redis_server;
pub mod store_server;
pub mod upstream;
pub mod wait;

/// Whether `error`, or what caused it, is a connection reset: how the gate
/// closes a connection it dropped for a write that waited too long.
pub fn is_reset(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset)
        {
            return true;
        }
        cause = e.source();
    }
    false
}
