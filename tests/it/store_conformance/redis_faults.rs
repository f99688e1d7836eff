//! Redis-only behaviour: the key layout, the script cache, and what happens
//! when the server goes away and comes back under a running store.

use std::time::{Duration, Instant};

use hookgate::store::{
    Backend, BackendSettings, Claim, Existing, RedisStore, ScopedKey, Store, StoreSettings,
};

use super::harness::{LONG, REDIS_OP_TIMEOUT, REDIS_PREFIX, RETAIN, fresh, key, snapshot};
use crate::support::redis_server::RedisServer;

const OP_TIMEOUT: Duration = Duration::from_millis(500);

fn settings(url: String) -> StoreSettings {
    StoreSettings {
        backend: BackendSettings::Redis {
            url,
            prefix: REDIS_PREFIX.into(),
        },
        op_timeout: OP_TIMEOUT,
    }
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Polls `ping` until it answers; the store must heal without reopening.
async fn until_ping_answers(store: &Store) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(error) = store.ping().await {
        assert!(Instant::now() < deadline, "store did not recover: {error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_are_prefixed_hashes_with_ttls() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), REDIS_PREFIX, REDIS_OP_TIMEOUT)
        .await
        .unwrap();
    let token = fresh(
        store
            .claim(&ScopedKey::new("github", "d-1"), "fp", LONG)
            .await
            .unwrap(),
    );
    let mut raw = raw(&server).await;
    let name = format!("{REDIS_PREFIX}:github:d-1");

    let kind: String = redis::cmd("TYPE")
        .arg(&name)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(kind, "hash");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&name)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        pttl > 0 && pttl <= LONG.as_millis() as i64,
        "lease TTL {pttl}"
    );

    let key = ScopedKey::new("github", "d-1");
    assert!(
        store
            .complete(&key, &token, &snapshot(), RETAIN)
            .await
            .unwrap()
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&name)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > LONG.as_millis() as i64, "retention TTL {pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scripts_reload_after_script_flush() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), REDIS_PREFIX, REDIS_OP_TIMEOUT)
        .await
        .unwrap();
    let token = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    let mut raw = raw(&server).await;
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();

    assert!(
        store
            .complete(&key("evt_1"), &token, &snapshot(), RETAIN)
            .await
            .unwrap()
    );
    let claim = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(snapshot())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_server_fails_fast_and_restart_heals() {
    let mut server = RedisServer::start();
    let store = Store::open(&settings(server.url())).await.unwrap();
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());

    server.kill();
    for _ in 0..3 {
        let started = Instant::now();
        let result = store.claim(&key("evt_2"), "fp", LONG).await;
        assert!(
            result.is_err(),
            "claim succeeded with redis down: {result:?}"
        );
        assert!(started.elapsed() < OP_TIMEOUT + Duration::from_millis(250));
        assert!(store.ping().await.is_err());
    }

    server.restart();
    until_ping_answers(&store).await;
    // Nothing was persisted, so the restarted server starts empty.
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opens_while_redis_is_down() {
    let mut server = RedisServer::start();
    server.kill();
    let store = Store::open(&settings(server.url()))
        .await
        .expect("open must not need redis");
    assert_eq!(store.backend_name(), "redis");
    assert!(store.ping().await.is_err());

    server.restart();
    until_ping_answers(&store).await;
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_never_show_the_password() {
    const PASSWORD: &str = "s3cr3t-Pa55word";
    let mut server = RedisServer::start();
    let url = server
        .url()
        .replace("redis://", &format!("redis://:{PASSWORD}@"));
    let store = Store::open(&settings(url)).await.unwrap();

    // The server has no password: AUTH is refused.
    let err = store.claim(&key("evt_1"), "fp", LONG).await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains(PASSWORD), "{err:?}");
    server.kill();
    let err = store.claim(&key("evt_1"), "fp", LONG).await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains(PASSWORD), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_urls_are_clear_errors() {
    // rediss:// opens lazily like redis://; nothing listens on this port,
    // and the failure names no password.
    let tls = "rediss://:s3cr3t-Pa55word@127.0.0.1:1/0";
    let store = RedisStore::open(tls, REDIS_PREFIX, OP_TIMEOUT)
        .await
        .expect("rediss URLs are supported");
    let err = store.ping().await.unwrap_err();
    let message = format!("{err} {err:?}");
    assert!(!message.contains("s3cr3t"), "{message}");

    let err = RedisStore::open("not a url", REDIS_PREFIX, OP_TIMEOUT)
        .await
        .err();
    assert!(err.is_some(), "a malformed URL must not open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_auth_heals_once_the_server_accepts_the_password() {
    let server = RedisServer::start();
    let url = server.url().replace("redis://", "redis://:rotated-secret@");
    let store = Store::open(&settings(url)).await.unwrap();
    assert!(
        store.ping().await.is_err(),
        "the server has no password yet"
    );

    let mut raw = raw(&server).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("rotated-secret")
        .query_async(&mut raw)
        .await
        .unwrap();
    until_ping_answers(&store).await;
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
}
