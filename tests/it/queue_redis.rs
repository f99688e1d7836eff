//! What queue mode on redis adds to the shared suites (the outbox
//! conformance suite, the gate round trip in `queue`): at the gate, a broken
//! outbox answers 503 with nothing recorded; a queue provider's keys sit in
//! an outbox shard under its hash tag, where `hookgate keys` finds them,
//! while forward-mode keys keep their layout.

use std::time::Duration;

use hookgate::config;
use hookgate::store::outbox::{Accept, AcceptPolicy, NewJob, Outbox};
use hookgate::store::{Backend, BackendSettings, ScopedKey, Snapshot, Store, StoreSettings};

use crate::cli::run_ok;
use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::gate::stripe_event;
use crate::support::redis_server::RedisServer;
use crate::support::upstream::Upstream;
use crate::support::wait::until;

/// `store.prefix` unless a config says otherwise.
const PREFIX: &str = "hookgate";

const QUEUE: &str =
    "[queue]\nretry_initial = \"50ms\"\nretry_max = \"200ms\"\nlease = \"5s\"\njitter = 0.0\n";

fn queued(server: &RedisServer) -> GateFixture {
    GateFixture::stripe()
        .provider_extra("mode = \"queue\"")
        .section(QUEUE)
        .store(StoreConfig::on(server))
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Every key under `pattern` (a KEYS glob).
async fn keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_broken_outbox_answers_503_and_leaves_no_dedupe_entry() {
    let server = RedisServer::start();
    let up = Upstream::start().await;
    let gate = queued(&server).upstream(&up).start().await;
    // Every shard's due set made a string, as a stray write or a bug would.
    let mut conn = raw(&server).await;
    let due: Vec<String> = (0..16)
        .map(|n| format!("{PREFIX}:{{q{n:02}}}:#due"))
        .collect();
    for key in &due {
        let () = redis::cmd("SET")
            .arg(key)
            .arg("broken")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let body = stripe_event("evt_rq_broken");
    let refused = gate.deliver(&body).await;
    assert_eq!(
        (refused.status.as_u16(), refused.result()),
        (503, "store_unavailable")
    );
    let key = ScopedKey::new("stripe", "evt_rq_broken");
    assert_eq!(
        gate.gate.store.get(&key).await.unwrap(),
        None,
        "no dedupe entry without its job"
    );
    assert_eq!(
        keys(&server, &format!("{PREFIX}:*evt_rq_broken")).await,
        Vec::<String>::new()
    );

    // Repaired, the provider's retry is accepted and delivered.
    let () = redis::cmd("DEL")
        .arg(&due)
        .query_async(&mut conn)
        .await
        .unwrap();
    let retry = gate.deliver(&body).await;
    assert_eq!((retry.status.as_u16(), retry.result()), (202, "accepted"));
    until("the delivery", || up.count() == 1).await;
    gate.shutdown().await;
}

fn settings(server: &RedisServer) -> StoreSettings {
    StoreSettings {
        backend: BackendSettings::Redis {
            url: server.url(),
            prefix: "hookgate-q".into(),
            queue: vec!["stripe".into()],
            cluster: false,
        },
        op_timeout: Duration::from_secs(2),
    }
}

fn accept(id: &str) -> Accept {
    Accept {
        key: ScopedKey::new("stripe", id),
        fingerprint: "fp".into(),
        job: NewJob {
            method: "POST".into(),
            target: "/webhooks/stripe".into(),
            headers: "content-type: application/json\r\n".into(),
            body: "{}".into(),
        },
    }
}

fn policy() -> AcceptPolicy {
    AcceptPolicy {
        answer: Snapshot {
            status: 202,
            content_type: None,
            body: bytes::Bytes::new(),
            truncated: false,
        },
        retention: Duration::from_secs(3600),
        reject_mismatch: true,
    }
}

#[tokio::test]
async fn queue_keys_carry_a_shard_hash_tag_and_forward_keys_keep_their_layout() {
    let server = RedisServer::start();
    let store = Store::open(&settings(&server)).await.unwrap();
    store
        .accept(vec![accept("evt_rq_tag")], policy())
        .await
        .unwrap();
    let forward = ScopedKey::new("github", "d-1");
    store
        .claim(&forward, "fp", Duration::from_secs(30))
        .await
        .unwrap();

    let tagged = keys(&server, "hookgate-q:*:stripe:evt_rq_tag").await;
    assert_eq!(tagged.len(), 1, "{tagged:?}");
    let shard = tagged[0]
        .strip_prefix("hookgate-q:{q")
        .and_then(|rest| rest.strip_suffix("}:stripe:evt_rq_tag"))
        .unwrap_or_else(|| panic!("not in a shard: {}", tagged[0]));
    assert!(
        shard.len() == 2 && shard.parse::<u8>().unwrap() < 16,
        "{shard}"
    );
    let job = keys(&server, &format!("hookgate-q:{{q{shard}}}:#job:*")).await;
    assert_eq!(job.len(), 1, "the job sits in the key's shard: {job:?}");
    assert_eq!(
        keys(&server, "hookgate-q:github:*").await,
        ["hookgate-q:github:d-1"],
        "a forward-mode provider keeps the old layout"
    );
}

#[tokio::test]
async fn keys_get_and_forget_reach_a_queue_providers_key() {
    let server = RedisServer::start();
    let gate = queued(&server).start().await;
    let body = stripe_event("evt_rq_cli");
    assert_eq!(gate.deliver(&body).await.result(), "accepted");
    let path = gate.fixture().config_file();
    let run = |action: &str| {
        run_ok(
            &path,
            &["keys", action, "--provider", "stripe", "evt_rq_cli"],
        )
    };
    let shown = run("get");
    assert!(shown.contains("completed (status 202"), "{shown}");
    assert!(run("forget").contains("forgotten"));
    let key = ScopedKey::new("stripe", "evt_rq_cli");
    assert_eq!(gate.gate.store.get(&key).await.unwrap(), None);
    gate.shutdown().await;
}

#[test]
fn queue_mode_is_accepted_on_redis_and_names_its_providers() {
    let toml = "[upstream]\nurl = \"http://127.0.0.1:9\"\n\
                [store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:9\"\n\
                [providers.stripe]\nscheme = \"stripe\"\npath = \"/s\"\nsecrets = [\"env:S\"]\nmode = \"queue\"\n\
                [providers.github]\nscheme = \"github\"\npath = \"/g\"\nsecrets = [\"env:G\"]\n";
    let settings = config::load(&config::figment_from_str(toml)).unwrap();
    match settings.store.backend {
        BackendSettings::Redis { queue, .. } => assert_eq!(queue, ["stripe"]),
        other => panic!("not redis: {other:?}"),
    }
}
