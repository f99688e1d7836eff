//! The outbox conformance suite (SPEC section 1b): one set of test
//! functions, generic over the durable backends, so sqlite, redis and
//! postgres accept, lease, settle, dead-letter and replay alike.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hookgate::store::outbox::{
    Accept, AcceptPolicy, Accepted, Job, JobFilter, JobState, NewJob, Outbox, Settle,
};
use hookgate::store::{Backend, Claim, Existing, KeyRecord, Snapshot};

use super::harness::{Harness, LONG, RETAIN, key};

mod backends;

/// A fresh, empty durable store (and its replicas, as for the dedupe
/// suite) whose outbox a test can break and repair.
pub trait OutboxHarness: Harness<Store: Outbox> {
    /// Makes every outbox write fail from outside, as a full disk or a bug
    /// would, while the dedupe side keeps working.
    fn break_outbox(&self) -> impl Future<Output = ()> + Send;

    /// Undoes [`OutboxHarness::break_outbox`].
    fn repair_outbox(&self) -> impl Future<Output = ()> + Send;
}

macro_rules! outbox_conformance {
    ($backend:ident, $harness:ty) => {
        mod $backend {
            use super::backends::*;
            instantiate!($harness;
                accept_records_the_entry_and_the_job_byte_exact,
                a_duplicate_enqueues_nothing,
                a_changed_payload_is_a_mismatch_and_rejecting_records_nothing,
                a_key_in_flight_blocks_the_whole_accept,
                a_failed_outbox_write_records_nothing,
                a_batch_enqueues_each_fresh_element,
                a_leased_job_is_not_taken_until_its_lease_expires,
                settle_is_a_compare_and_set_on_the_lease,
                a_retry_waits_for_its_backoff,
                dead_letter_then_replay_starts_a_new_series,
                purge_deletes_only_what_the_filter_selects,
                depth_counts_pending_leased_and_dead,
                depth_counts_every_job_of_a_long_backlog,
                two_replicas_never_take_the_same_job,
                concurrent_accepts_of_one_key_enqueue_once,
            );
        }
    };
}

outbox_conformance!(sqlite, SqliteOutbox);
outbox_conformance!(redis, RedisOutbox);
outbox_conformance!(postgres, PostgresOutbox);
outbox_conformance!(redis_cluster, RedisClusterOutbox);

fn job(body: &'static [u8]) -> NewJob {
    NewJob {
        method: "POST".into(),
        target: "/webhooks/stripe?x=1".into(),
        headers: Bytes::from_static(b"content-type: application/json\r\nx-raw: \xff\x80\r\n"),
        body: Bytes::from_static(body),
    }
}

fn item(id: &str, fingerprint: &str) -> Accept {
    Accept {
        key: key(id),
        fingerprint: fingerprint.into(),
        job: job(b"{\"id\":1}\n\xff\x00"),
    }
}

fn answer() -> Snapshot {
    Snapshot {
        status: 202,
        content_type: Some("application/json".into()),
        body: Bytes::from_static(b"{\"accepted\":true}"),
        truncated: false,
    }
}

fn policy(reject_mismatch: bool) -> AcceptPolicy {
    AcceptPolicy {
        answer: answer(),
        retention: RETAIN,
        reject_mismatch,
    }
}

async fn accept_one(store: &impl Outbox, id: &str) -> Accepted {
    let mut outcome = store.accept(vec![item(id, "fp")], policy(true)).await;
    outcome
        .as_mut()
        .expect("accept")
        .pop()
        .expect("one outcome")
}

fn filter(state: JobState) -> JobFilter {
    JobFilter {
        state: Some(state),
        ..JobFilter::default()
    }
}

async fn count(store: &impl Outbox, state: JobState) -> usize {
    store.jobs(filter(state), 1000).await.expect("jobs").len()
}

async fn take(store: &impl Outbox, lease: Duration) -> Vec<Job> {
    store.take_due(lease, 100).await.expect("take_due")
}

async fn take_one(store: &impl Outbox) -> Job {
    let mut jobs = take(store, LONG).await;
    assert_eq!(jobs.len(), 1, "expected one due job, got {jobs:?}");
    jobs.pop().unwrap()
}

/// Waits until `store` has a due job (a lease or a backoff running out).
async fn take_when_due(store: &impl Outbox, within: Duration) -> Job {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(job) = take(store, LONG).await.pop() {
            return job;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no job came due within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn accept_records_the_entry_and_the_job_byte_exact<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    assert_eq!(accept_one(&*store, "evt_a").await, Accepted::Enqueued);
    let mut record = store.get(&key("evt_a")).await.unwrap().expect("a record");
    let left = record.expires_in.take().expect("its retention left");
    assert!(left > RETAIN - Duration::from_secs(60), "{left:?}");
    assert_eq!(
        record,
        KeyRecord {
            fingerprint: "fp".into(),
            state: Existing::Completed(answer()),
            expires_in: None,
        }
    );
    let pending = store.jobs(filter(JobState::Pending), 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].key.clone(), pending[0].attempts),
        (key("evt_a"), 0)
    );
    let taken = take_one(&*store).await;
    assert_eq!((taken.key, taken.attempt), (key("evt_a"), 1));
    assert_eq!(
        taken.job,
        item("evt_a", "fp").job,
        "the job is stored byte for byte"
    );
    let age = SystemTime::now().duration_since(taken.received_at).unwrap();
    assert!(
        age < Duration::from_secs(60),
        "received_at is now, not {age:?} ago"
    );
}

async fn a_duplicate_enqueues_nothing<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    accept_one(&*store, "evt_d").await;
    assert_eq!(
        accept_one(&*store, "evt_d").await,
        Accepted::Existing(Existing::Completed(answer()))
    );
    let replica = h.replica().await;
    assert_eq!(
        accept_one(&*replica, "evt_d").await,
        Accepted::Existing(Existing::Completed(answer())),
        "a second replica sees the same entry"
    );
    assert_eq!(count(&*store, JobState::Pending).await, 1);
}

async fn a_changed_payload_is_a_mismatch_and_rejecting_records_nothing<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    accept_one(&*store, "evt_m").await;
    let batch = || vec![item("evt_new", "fp"), item("evt_m", "other")];
    let rejected = store.accept(batch(), policy(true)).await.unwrap();
    assert_eq!(rejected[0], Accepted::Enqueued, "what it would have been");
    assert!(
        matches!(&rejected[1], Accepted::Mismatch { stored_fingerprint, .. } if stored_fingerprint == "fp"),
        "{rejected:?}"
    );
    assert_eq!(store.get(&key("evt_new")).await.unwrap(), None);
    assert_eq!(
        count(&*store, JobState::Pending).await,
        1,
        "nothing enqueued"
    );

    let flagged = store.accept(batch(), policy(false)).await.unwrap();
    assert!(matches!(flagged[1], Accepted::Mismatch { .. }));
    assert_eq!(
        count(&*store, JobState::Pending).await,
        2,
        "the fresh one enqueued"
    );
}

async fn a_key_in_flight_blocks_the_whole_accept<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    // A forward-mode delivery of the same key is in flight.
    let claim = store.claim(&key("evt_busy"), "fp", LONG).await.unwrap();
    assert!(matches!(claim, Claim::Fresh(_)));
    let outcome = store
        .accept(
            vec![item("evt_free", "fp"), item("evt_busy", "fp")],
            policy(false),
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome[1], Accepted::Existing(Existing::InFlight { .. })),
        "{outcome:?}"
    );
    assert_eq!(store.get(&key("evt_free")).await.unwrap(), None);
    assert_eq!(count(&*store, JobState::Pending).await, 0);
}

async fn a_failed_outbox_write_records_nothing<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    h.break_outbox().await;
    let failed = store.accept(vec![item("evt_f", "fp")], policy(true)).await;
    assert!(failed.is_err(), "the accept must fail: {failed:?}");
    assert_eq!(
        store.get(&key("evt_f")).await.unwrap(),
        None,
        "no dedupe entry without its job"
    );
    h.repair_outbox().await;
    assert_eq!(accept_one(&*store, "evt_f").await, Accepted::Enqueued);
    assert_eq!(take_one(&*store).await.key, key("evt_f"));
}

async fn a_batch_enqueues_each_fresh_element<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    accept_one(&*store, "evt_b2").await;
    let items = ["evt_b1", "evt_b2", "evt_b3"]
        .map(|id| item(id, "fp"))
        .to_vec();
    let outcome = store.accept(items, policy(true)).await.unwrap();
    assert_eq!(outcome[0], Accepted::Enqueued);
    assert!(matches!(outcome[1], Accepted::Existing(_)));
    assert_eq!(outcome[2], Accepted::Enqueued);
    let mut taken: Vec<_> = take(&*store, LONG)
        .await
        .into_iter()
        .map(|j| j.key)
        .collect();
    taken.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(taken, [key("evt_b1"), key("evt_b2"), key("evt_b3")]);
}

async fn a_leased_job_is_not_taken_until_its_lease_expires<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    accept_one(&*store, "evt_l").await;
    // Opened first, so that its opening does not eat into the lease.
    let replica = h.replica().await;
    let first = take(&*store, Duration::from_secs(2)).await;
    assert_eq!(first.len(), 1);
    assert!(
        take(&*replica, LONG).await.is_empty(),
        "leased: nobody takes it"
    );
    // The relay that took it died: its lease runs out, another takes it.
    let again = take_when_due(&*replica, Duration::from_secs(5)).await;
    assert_eq!((again.id, again.attempt), (first[0].id, 2));
    assert_ne!(again.token, first[0].token);
}

async fn settle_is_a_compare_and_set_on_the_lease<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    accept_one(&*store, "evt_s").await;
    let stale = take(&*store, Duration::from_millis(300))
        .await
        .pop()
        .unwrap();
    let current = take_when_due(&*store, Duration::from_secs(5)).await;
    let delivered = Settle::Delivered { status: 200 };
    assert!(
        !store
            .settle(stale.id, &stale.token, delivered.clone())
            .await
            .unwrap()
    );
    assert!(
        store
            .settle(current.id, &current.token, delivered.clone())
            .await
            .unwrap()
    );
    assert!(
        !store
            .settle(current.id, &current.token, delivered)
            .await
            .unwrap(),
        "a settled job is not settled twice"
    );
    assert_eq!(count(&*store, JobState::Delivered).await, 1);
    assert!(take(&*store, LONG).await.is_empty());
}

async fn a_retry_waits_for_its_backoff<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    accept_one(&*store, "evt_r").await;
    let first = take_one(&*store).await;
    let retry = Settle::Retry {
        after: Duration::from_secs(2),
        status: Some(503),
        error: "upstream answered 503".into(),
    };
    assert!(store.settle(first.id, &first.token, retry).await.unwrap());
    assert!(
        take(&*store, LONG).await.is_empty(),
        "not before its backoff"
    );
    let summary = store.jobs(filter(JobState::Pending), 10).await.unwrap();
    assert_eq!(summary[0].last_status, Some(503));
    assert_eq!(
        summary[0].last_error.as_deref(),
        Some("upstream answered 503")
    );
    let second = take_when_due(&*store, Duration::from_secs(5)).await;
    assert_eq!((second.id, second.attempt), (first.id, 2));
}

async fn dead_letter_then_replay_starts_a_new_series<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    accept_one(&*store, "evt_x").await;
    let taken = take_one(&*store).await;
    let dead = Settle::Dead {
        status: Some(410),
        error: "upstream answered 410".into(),
    };
    assert!(store.settle(taken.id, &taken.token, dead).await.unwrap());
    let letters = store.jobs(filter(JobState::Dead), 10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].last_status, letters[0].attempts),
        (Some(410), 1)
    );
    assert!(
        take(&*store, LONG).await.is_empty(),
        "the dead are not retried"
    );

    let dead_filter = JobFilter {
        provider: Some("stripe".into()),
        ..filter(JobState::Dead)
    };
    assert_eq!(store.replay(dead_filter.clone()).await.unwrap(), 1);
    assert_eq!(store.replay(dead_filter).await.unwrap(), 0, "none dead now");
    let replayed = take_one(&*store).await;
    assert_eq!((replayed.id, replayed.attempt), (taken.id, 1));
    assert_eq!(
        accept_one(&*store, "evt_x").await,
        Accepted::Existing(Existing::Completed(answer())),
        "the dedupe entry is untouched by a replay"
    );
}

async fn purge_deletes_only_what_the_filter_selects<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    for id in ["evt_p1", "evt_p2", "evt_p3"] {
        accept_one(&*store, id).await;
    }
    let taken = take(&*store, LONG).await;
    let victim = taken.iter().find(|j| j.key == key("evt_p2")).unwrap();
    let dead = Settle::Dead {
        status: None,
        error: "gave up".into(),
    };
    assert!(store.settle(victim.id, &victim.token, dead).await.unwrap());
    let future = JobFilter {
        before: Some(SystemTime::now() - Duration::from_secs(3600)),
        ..filter(JobState::Dead)
    };
    assert_eq!(
        store.purge(future).await.unwrap(),
        0,
        "older than an hour: none"
    );
    assert_eq!(store.purge(filter(JobState::Dead)).await.unwrap(), 1);
    assert_eq!(count(&*store, JobState::Dead).await, 0);
    assert_eq!(count(&*store, JobState::Pending).await, 2);
    let one = JobFilter {
        key: Some("evt_p3".into()),
        ..JobFilter::default()
    };
    let shown = store.jobs(one, 10).await.unwrap();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].key, key("evt_p3"));
}

async fn depth_counts_pending_leased_and_dead<H: OutboxHarness>() {
    let h = H::start().await;
    let store = h.store();
    assert!(
        store
            .depth()
            .await
            .unwrap()
            .iter()
            .all(|d| d.pending + d.leased + d.dead == 0)
    );
    for id in ["evt_q1", "evt_q2", "evt_q3"] {
        accept_one(&*store, id).await;
    }
    let taken = store.take_due(LONG, 2).await.unwrap();
    assert_eq!(taken.len(), 2, "at most the limit");
    let dead = Settle::Dead {
        status: Some(404),
        error: "upstream answered 404".into(),
    };
    assert!(
        store
            .settle(taken[0].id, &taken[0].token, dead)
            .await
            .unwrap()
    );
    let depth = store.depth().await.unwrap();
    let stripe = depth
        .iter()
        .find(|d| d.provider == "stripe")
        .expect("stripe");
    assert_eq!(
        (stripe.pending, stripe.leased, stripe.dead),
        (1, 1, 1),
        "{depth:?}"
    );
    assert!(stripe.oldest_pending.is_some());
}

/// A backlog larger than any one page a backend might read its depth in
/// (4,000 jobs put about 250 in each of redis's 16 shards): every job is
/// counted, once.
async fn depth_counts_every_job_of_a_long_backlog<H: OutboxHarness>() {
    const JOBS: usize = 4000;
    const LEASED: usize = 1000;
    const DEAD: usize = 100;
    let h = H::start().await;
    let store = h.store();
    let ids: Vec<String> = (0..JOBS).map(|n| format!("evt_d{n}")).collect();
    for batch in ids.chunks(200) {
        let items = batch.iter().map(|id| item(id, "fp")).collect();
        let outcome = store.accept(items, policy(true)).await.unwrap();
        assert!(outcome.iter().all(|a| *a == Accepted::Enqueued));
    }
    let mut taken = Vec::new();
    while taken.len() < LEASED {
        let jobs = store
            .take_due(LONG, LEASED - taken.len())
            .await
            .expect("take_due");
        assert!(
            !jobs.is_empty(),
            "{} jobs due, none taken",
            JOBS - taken.len()
        );
        taken.extend(jobs);
    }
    for job in &taken[..DEAD] {
        let dead = Settle::Dead {
            status: None,
            error: "gave up".into(),
        };
        assert!(store.settle(job.id, &job.token, dead).await.unwrap());
    }
    let depth = store.depth().await.unwrap();
    assert_eq!(depth.len(), 1, "{depth:?}");
    let stripe = &depth[0];
    assert_eq!(stripe.provider, "stripe");
    assert_eq!(
        (stripe.pending, stripe.leased, stripe.dead),
        ((JOBS - LEASED) as u64, (LEASED - DEAD) as u64, DEAD as u64),
    );
    let oldest = store
        .jobs(filter(JobState::Pending), JOBS)
        .await
        .expect("jobs")
        .into_iter()
        .map(|j| j.received_at)
        .min();
    assert_eq!(
        stripe.oldest_pending, oldest,
        "the oldest of every page and shard"
    );
}

async fn two_replicas_never_take_the_same_job<H: OutboxHarness>() {
    const JOBS: usize = 60;
    let h = H::start().await;
    let store = h.store();
    let items = (0..JOBS)
        .map(|n| item(&format!("evt_t{n}"), "fp"))
        .collect();
    store.accept(items, policy(true)).await.unwrap();
    let stores = [store, h.replica().await];
    let takers: Vec<_> = (0..6)
        .map(|n| {
            let store = Arc::clone(&stores[n % 2]);
            tokio::spawn(async move {
                let mut ids = Vec::new();
                loop {
                    let jobs = store.take_due(LONG, 4).await.expect("take_due");
                    if jobs.is_empty() {
                        return ids;
                    }
                    ids.extend(jobs.into_iter().map(|j| j.id));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for taker in takers {
        all.extend(taker.await.unwrap());
    }
    all.sort_unstable();
    let taken = all.len();
    all.dedup();
    assert_eq!(
        (taken, all.len()),
        (JOBS, JOBS),
        "each job taken exactly once"
    );
}

async fn concurrent_accepts_of_one_key_enqueue_once<H: OutboxHarness>() {
    const SENDERS: usize = 20;
    let h = H::start().await;
    let stores = [h.store(), h.replica().await];
    for round in 0..5 {
        let id = format!("evt_c{round}");
        let start = Arc::new(tokio::sync::Barrier::new(SENDERS));
        let senders: Vec<_> = (0..SENDERS)
            .map(|n| {
                let (store, id, start) =
                    (Arc::clone(&stores[n % 2]), id.clone(), Arc::clone(&start));
                tokio::spawn(async move {
                    start.wait().await;
                    store.accept(vec![item(&id, "fp")], policy(true)).await
                })
            })
            .collect();
        let mut enqueued = 0;
        for sender in senders {
            match sender.await.unwrap().expect("accept").pop().unwrap() {
                Accepted::Enqueued => enqueued += 1,
                Accepted::Existing(Existing::Completed(_)) => {}
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert_eq!(enqueued, 1, "round {round}");
    }
    assert_eq!(count(&*stores[0], JobState::Pending).await, 5);
}
