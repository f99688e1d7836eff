//! One integration test binary: the real gate on port 0, a recording
//! upstream on port 0, real redis-server processes.

mod answers;
mod batch;
mod chaos;
mod chaos_queue;
mod cli;
mod dedupe;
mod forwarding;
mod fuzz_corpus;
mod housekeeping;
mod malformed;
mod operate;
mod otlp;
mod panics;
mod queue;
mod queue_redis;
mod routing;
mod schemes;
mod secrets;
mod slack_forms;
mod slow_clients;
mod store_conformance;
mod store_faults;
mod support;
mod tls;
mod traces;
mod verification;
