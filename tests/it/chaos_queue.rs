//! Queue mode through faults (SPEC section 1b, docs/RELIABILITY.md): the
//! chaos run of `chaos.rs` with every delivery accepted into the outbox.
//!
//! Hundreds of events (`CHAOS_EVENTS`), each sent as several copies in
//! random order by concurrent senders that retry until a 2xx, through three
//! `hookgate run` processes sharing one store (redis with append-only
//! persistence, or PostgreSQL). The app answers 500 to a third of the
//! relays' attempts and is down entirely (connections closed unanswered)
//! for 20 s; one gate is SIGKILLed mid-run and restarted.
//!
//! Afterwards: every event accepted once (one job each, and at most one
//! `accepted` answer), delivered to the app at least once, nothing left
//! pending, nothing dead. An event the app answered 2xx twice must be
//! explained by the kill: one of its 2xx came from the killed process,
//! which died before it could settle the job, so the job's lease expired
//! and another relay delivered it again; or a relay could not record an
//! attempt within its lease (it logs that, and the job is attempted again
//! though the app had it). Such doubles are counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookgate::store::Store;
use hookgate::store::outbox::{JobFilter, JobState, Outbox};

use crate::chaos::crowd::{
    GATES, Gates, Seen, Senders, VICTIM, app_successes, env_usize, shuffled_copies,
};
use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::postgres_server::PostgresServer;
use crate::support::redis_server::RedisServer;
use crate::support::store_server::StoreServer;
use crate::support::upstream::{Behavior, Upstream};

/// Quick retries (so the run drains soon after the app is back), a lease
/// well past the upstream timeout, and nothing dead-lettered for a 500.
const QUEUE: &str = "[queue]\nretry_initial = \"100ms\"\nretry_max = \"1s\"\njitter = 0.2\n\
                     lease = \"3s\"\nmax_attempts = 1000\nmax_age = \"1h\"\n";
const APP_DOWN: Duration = Duration::from_secs(20);
/// How long the relays get, after the senders are done, to drain.
const DRAIN: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_mode_through_faults_on_redis() {
    accepted_once_delivered_at_least_once(RedisServer::start_with_aof).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_mode_through_faults_on_postgres() {
    accepted_once_delivered_at_least_once(PostgresServer::start).await;
}

fn process_config(n: usize, up: &Upstream, store: &StoreConfig) -> GateFixture {
    GateFixture::stripe()
        .provider_extra("mode = \"queue\"")
        .section(QUEUE)
        .upstream_url(&format!("{}/i{n}", up.url()))
        .upstream_timeout("1s")
        .store(store.clone())
}

/// What the senders saw, per event.
#[derive(Default)]
struct Answers {
    accepted: usize,
    duplicate: usize,
    refused: usize,
    broken: usize,
}

impl Answers {
    fn count(&mut self, seen: Seen, result: Option<&str>) {
        match (seen, result) {
            (Seen::Status(202), Some("accepted")) => self.accepted += 1,
            (Seen::Status(202), Some("duplicate")) => self.duplicate += 1,
            (Seen::Status(_), _) => self.refused += 1,
            (Seen::Broken, _) => self.broken += 1,
        }
    }
}

async fn accepted_once_delivered_at_least_once<S: StoreServer>(start: fn() -> S) {
    let events = env_usize("CHAOS_EVENTS", 300);
    let copies = env_usize("CHAOS_COPIES", 3);
    let clients = env_usize("CHAOS_CLIENTS", 32);
    let started = Instant::now();
    let server = tokio::task::spawn_blocking(start).await.unwrap();
    let store_config = StoreConfig::on(&server).timeout(S::GATE_TIMEOUT);
    let up = Upstream::start().await;
    let flaky = Behavior::Random {
        fail_percent: 33,
        stall_percent: 0,
        stall: Duration::ZERO,
    };
    up.set(flaky.clone());

    let app = up.clone();
    let gates = Gates::start(move |n| process_config(n, &app, &store_config)).await;

    let answers = Arc::new(Mutex::new(HashMap::<usize, Answers>::new()));
    let order = shuffled_copies(events, copies, 0x5eed_cafe_f00d_0002);
    let total = order.len();
    let seen = Arc::clone(&answers);
    let senders = Senders::start(
        &gates,
        order,
        clients,
        0x1234_5678_9abc_def3,
        "evt_qchaos_",
        move |event, _, answer, result| {
            let mut all = seen.lock().unwrap();
            all.entry(event)
                .or_default()
                .count(answer, result.as_deref());
        },
    );

    // A gate dies mid-run, its relay's attempts in flight with it.
    senders.reached(0.3).await;
    let killed_at = senders.done();
    let mut logs = gates.kill_and_replace_victim().await;
    // The app goes down for 20 s; the accepts go on.
    senders.reached(0.5).await;
    up.set(Behavior::Down);
    let app_down_at = Instant::now();
    let gave_up = senders.finish().await;
    tokio::time::sleep(APP_DOWN.saturating_sub(app_down_at.elapsed())).await;
    up.set(flaky);
    let senders_done = started.elapsed();

    // The relays drain the outbox.
    let settings = hookgate::config::load(&hookgate::config::figment_from_str(&gates.toml()))
        .expect("the run's config");
    let store = Store::open(&settings.store).await.expect("open the store");
    let pending = JobFilter {
        state: Some(JobState::Pending),
        ..JobFilter::default()
    };
    let deadline = Instant::now() + DRAIN;
    let mut left = usize::MAX;
    while Instant::now() < deadline {
        left = store
            .jobs(pending.clone(), 10_000)
            .await
            .map_or(usize::MAX, |j| j.len());
        if left == 0 && app_successes(&up.received(), "evt_qchaos_").len() == events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained = started.elapsed();
    let jobs = store
        .jobs(JobFilter::default(), 100_000)
        .await
        .expect("jobs");
    let mut jobs_per_event: HashMap<usize, usize> = HashMap::new();
    for job in &jobs {
        if let Some(event) = job
            .key
            .key
            .strip_prefix("evt_qchaos_")
            .and_then(|e| e.parse().ok())
        {
            *jobs_per_event.entry(event).or_default() += 1;
        }
    }
    let dead = jobs.iter().filter(|j| j.state == JobState::Dead).count();

    logs.extend(gates.stop().await);
    let unsettled = unsettled(&logs);

    let oks = app_successes(&up.received(), "evt_qchaos_");
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let (mut lost, mut doubled, mut unexplained, mut twice_accepted) = (vec![], 0, vec![], vec![]);
    let (mut via_victim_doubles, mut via_unsettled_doubles) = (0, 0);
    for event in 0..events {
        let calls = oks.get(&event).map(Vec::as_slice).unwrap_or(&[]);
        let victim_calls = calls.iter().filter(|&&i| i == VICTIM).count();
        match calls.len() {
            0 => lost.push(event),
            1 => {}
            n => {
                doubled += 1;
                let by_kill = victim_calls.min(n - 1);
                let by_settle = unsettled
                    .get(&event)
                    .copied()
                    .unwrap_or(0)
                    .min(n - 1 - by_kill);
                via_victim_doubles += by_kill;
                via_unsettled_doubles += by_settle;
                if n - 1 > by_kill + by_settle {
                    unexplained.push((event, calls.to_vec()));
                }
            }
        }
        if answers.get(&event).is_some_and(|a| a.accepted > 1) {
            twice_accepted.push(event);
        }
    }
    let sum = |f: fn(&Answers) -> usize| answers.values().map(f).sum::<usize>();
    let received = up.received();
    let figures = serde_json::json!({
        "store": S::BACKEND,
        "events": events,
        "copies_per_event": copies,
        "deliveries": total,
        "concurrent_senders": clients,
        "gate_instances": GATES,
        "answers_accepted": sum(|a| a.accepted),
        "answers_duplicate": sum(|a| a.duplicate),
        "answers_refused": sum(|a| a.refused),
        "broken_connections": sum(|a| a.broken),
        "senders_gave_up": gave_up,
        "app_calls": received.len(),
        "app_calls_failed_500": received.iter().filter(|r| r.status == 500).count(),
        "app_down_seconds": APP_DOWN.as_secs(),
        "gate_sigkilled_at_delivery": killed_at,
        "jobs": jobs.len(),
        "jobs_left_pending": left,
        "jobs_dead": dead,
        "lost": lost.len(),
        "doubled": doubled,
        "doubles_from_the_killed_gate": via_victim_doubles,
        "doubles_from_unsettled_attempts": via_unsettled_doubles,
        "seconds_until_senders_done": senders_done.as_secs_f64(),
        "seconds_until_drained": drained.as_secs_f64(),
    });
    println!("queue chaos figures: {figures}");
    assert_eq!(gave_up, 0, "{figures}");
    assert!(
        twice_accepted.is_empty(),
        "accepted twice: {twice_accepted:?}\n{figures}"
    );
    let not_one_job: Vec<_> = (0..events)
        .filter(|e| jobs_per_event.get(e) != Some(&1))
        .collect();
    assert!(
        not_one_job.is_empty(),
        "events without exactly one job: {not_one_job:?}\n{figures}"
    );
    assert!(lost.is_empty(), "never delivered: {lost:?}\n{figures}");
    assert_eq!((left, dead), (0, 0), "pending or dead jobs left\n{figures}");
    assert!(
        unexplained.is_empty(),
        "delivered twice, not by the SIGKILL (event, processes): {unexplained:?}\n{figures}"
    );
    // The faults happened.
    assert!(received.iter().any(|r| r.status == 500), "{figures}");
}

/// Per event, the attempts whose end a relay could not record within the
/// job's lease (the store was too slow or down, or the attempt outlasted
/// the lease), as the gates logged them: the job was attempted again
/// though the app had it, the relay's other at-least-once boundary.
fn unsettled(logs: &[String]) -> HashMap<usize, usize> {
    let mut count = HashMap::new();
    for line in logs {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let message = entry["message"].as_str().unwrap_or_default();
        if !message.starts_with("relay: settling the attempt failed")
            && !message.starts_with("relay: the job's lease had expired")
        {
            continue;
        }
        if let Some(event) = entry["key"]
            .as_str()
            .and_then(|k| k.strip_prefix("stripe:evt_qchaos_")?.parse().ok())
        {
            *count.entry(event).or_default() += 1;
        }
    }
    count
}
