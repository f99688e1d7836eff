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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookgate::store::Store;
use hookgate::store::outbox::{JobFilter, JobState, Outbox};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::chaos::{
    Cluster, GATES, HttpClient, Instance, Rng, Seen, VICTIM, attempt, env_usize, spawn_gate,
};
use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::gate::stripe_event;
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
const SENDER_ATTEMPTS: u32 = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_mode_through_faults_on_redis() {
    accepted_once_delivered_at_least_once(RedisServer::start_with_aof).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_mode_through_faults_on_postgres() {
    accepted_once_delivered_at_least_once(PostgresServer::start).await;
}

fn instance_config(instance: usize, up: &Upstream, store: &StoreConfig) -> GateFixture {
    GateFixture::stripe()
        .provider_extra("mode = \"queue\"")
        .section(QUEUE)
        .upstream_url(&format!("{}/i{instance}", up.url()))
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

/// Sends one copy until a 2xx, like a provider; false if it gave up.
async fn send(
    client: &HttpClient,
    cluster: &Cluster,
    event: usize,
    rng: &mut Rng,
    answers: &Mutex<HashMap<usize, Answers>>,
) -> bool {
    let body = stripe_event(&format!("evt_qchaos_{event}"));
    for n in 0..SENDER_ATTEMPTS {
        let (_, addr) = cluster.pick(rng.next());
        let (seen, result) = attempt(client, addr, &body).await;
        {
            let mut all = answers.lock().unwrap();
            let mine = all.entry(event).or_default();
            match (seen, result.as_deref()) {
                (Seen::Status(202), Some("accepted")) => mine.accepted += 1,
                (Seen::Status(202), Some("duplicate")) => mine.duplicate += 1,
                (Seen::Status(_), _) => mine.refused += 1,
                (Seen::Broken, _) => mine.broken += 1,
            }
        }
        if matches!(seen, Seen::Status(s) if (200..300).contains(&s)) {
            return true;
        }
        let backoff = (20u64 << n.min(6)).min(1000);
        tokio::time::sleep(Duration::from_millis(
            backoff / 2 + rng.next() % (backoff / 2 + 1),
        ))
        .await;
    }
    false
}

/// The app's 2xx answers per event, and through which process each came.
fn app_successes(up: &Upstream) -> HashMap<usize, Vec<usize>> {
    let mut oks: HashMap<usize, Vec<usize>> = HashMap::new();
    for r in up
        .received()
        .iter()
        .filter(|r| (200..300).contains(&r.status))
    {
        let Some(event) = serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| v["id"].as_str()?.strip_prefix("evt_qchaos_")?.parse().ok())
        else {
            continue;
        };
        let instance = r.uri[2..r.uri.find("/webhooks").unwrap()].parse().unwrap();
        oks.entry(event).or_default().push(instance);
    }
    oks
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

    let mut configs = Vec::new();
    let mut children = Vec::new();
    let mut instances = Vec::new();
    for g in 0..GATES {
        configs.push(instance_config(g, &up, &store_config));
        let (child, addr) = spawn_gate(&configs[g]).await;
        children.push(Some(child));
        instances.push(Instance { addr });
    }
    let cluster = Arc::new(Cluster {
        slots: Mutex::new([0, 1, 2]),
        instances: Mutex::new(instances),
    });

    let mut rng = Rng(0x5eed_cafe_f00d_0002);
    let mut order: Vec<usize> = (0..events)
        .flat_map(|e| std::iter::repeat_n(e, copies))
        .collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let order = Arc::new(order);
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let gave_up = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Mutex::new(HashMap::new()));
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(2))
        .build(HttpConnector::new());
    let senders: Vec<_> = (0..clients)
        .map(|c| {
            let (order, next, done, gave_up, answers, cluster, client) = (
                Arc::clone(&order),
                Arc::clone(&next),
                Arc::clone(&done),
                Arc::clone(&gave_up),
                Arc::clone(&answers),
                Arc::clone(&cluster),
                client.clone(),
            );
            tokio::spawn(async move {
                let mut rng = Rng(0x1234_5678_9abc_def3 ^ ((c as u64 + 1) << 20));
                while let Some(&event) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if !send(&client, &cluster, event, &mut rng, &answers).await {
                        gave_up.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    let total = order.len();
    let reached = |fraction: f64| {
        let done = Arc::clone(&done);
        async move {
            while (done.load(Ordering::Relaxed) as f64) < total as f64 * fraction {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    // A gate dies mid-run, its relay's attempts in flight with it.
    reached(0.3).await;
    let killed_at = done.load(Ordering::Relaxed);
    let victim = children[VICTIM].take().unwrap();
    let mut logs = tokio::task::spawn_blocking(move || victim.kill())
        .await
        .unwrap();
    let reborn = GATES;
    configs.push(instance_config(reborn, &up, &store_config));
    let (child, addr) = spawn_gate(&configs[reborn]).await;
    children.push(Some(child));
    cluster.instances.lock().unwrap().push(Instance { addr });
    cluster.slots.lock().unwrap()[VICTIM] = reborn;
    // The app goes down for 20 s; the accepts go on.
    reached(0.5).await;
    up.set(Behavior::Down);
    let app_down_at = Instant::now();
    for s in senders {
        s.await.unwrap();
    }
    tokio::time::sleep(APP_DOWN.saturating_sub(app_down_at.elapsed())).await;
    up.set(flaky);
    let senders_done = started.elapsed();

    // The relays drain the outbox.
    let settings = hookgate::config::load(&hookgate::config::figment_from_str(&configs[0].toml()))
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
        if left == 0 && app_successes(&up).len() == events {
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

    for child in children.into_iter().flatten() {
        if let Ok((_, lines)) = tokio::task::spawn_blocking(move || child.stop()).await {
            logs.extend(lines);
        }
    }
    let unsettled = unsettled(&logs);

    let oks = app_successes(&up);
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
        "senders_gave_up": gave_up.load(Ordering::Relaxed),
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
    assert_eq!(gave_up.load(Ordering::Relaxed), 0, "{figures}");
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
