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
