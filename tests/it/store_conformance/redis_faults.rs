//! Redis-only behaviour: the key layout, the script cache, URLs, and a
//! password that the server starts to require. (Killing and restarting the
//! server is the shared fault suite's, in `faults`.)

use hookgate::store::{Backend, Claim, Existing, RedisStore, ScopedKey, Snapshot, Store};

use super::faults::{FaultServer, OP_TIMEOUT, until_ping_answers};
use super::harness::{LONG, REDIS_PREFIX, completes, fresh, key, open_redis, snapshot};
use crate::support::redis_server::RedisServer;

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_are_prefixed_strings_with_ttls() {
    let server = RedisServer::start();
    let store = open_redis(&server.url()).await;
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
    assert_eq!(kind, "string");
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
    assert!(completes(&store, &key, &token, &snapshot()).await);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&name)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > LONG.as_millis() as i64, "retention TTL {pttl}");
}

/// A completed key as versions before string values wrote it: a hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_written_as_hashes_are_still_duplicates() {
    let server = RedisServer::start();
    let store = open_redis(&server.url()).await;
    let mut raw = raw(&server).await;
    let name = format!("{REDIS_PREFIX}:stripe:evt_old");
    let () = redis::cmd("HSET")
        .arg(&name)
        .arg(&[
            "state",
            "completed",
            "fp",
            "fp",
            "status",
            "200",
            "body",
            "{}",
            "cut",
            "0",
        ])
        .query_async(&mut raw)
        .await
        .map(|_: i64| ())
        .unwrap();
    let () = redis::cmd("PEXPIRE")
        .arg(&name)
        .arg(60_000)
        .query_async(&mut raw)
        .await
        .map(|_: i64| ())
        .unwrap();
    let old = Snapshot {
        status: 200,
        content_type: None,
        body: "{}".into(),
        truncated: false,
    };
    let key = ScopedKey::new("stripe", "evt_old");

    let claim = store.claim(&key, "fp", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(old.clone())));
    let claim = store.claim(&key, "other", LONG).await.unwrap();
    assert!(matches!(claim, Claim::Mismatch { .. }), "{claim:?}");
    let record = store.get(&key).await.unwrap().expect("the old key");
    assert_eq!(record.state, Existing::Completed(old));
    assert!(record.expires_in.is_some_and(|t| t.as_millis() <= 60_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scripts_reload_after_script_flush() {
    let server = RedisServer::start();
    let store = open_redis(&server.url()).await;
    let token = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    let mut raw = raw(&server).await;
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();

    assert!(completes(&store, &key("evt_1"), &token, &snapshot()).await);
    let claim = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(snapshot())));
}

/// Concurrent deliveries' commands share batches (`store/redis/batch.rs`):
/// each caller still gets its own reply, and with the script cache flushed
/// every `EVALSHA` of a batch fails alone, loads the script and retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_commands_in_batches_each_get_their_own_reply() {
    const EVENTS: usize = 200;
    let server = RedisServer::start();
    let store = std::sync::Arc::new(open_redis(&server.url()).await);
    let body = |i: usize| Snapshot {
        body: format!("event {i}").into(),
        ..snapshot()
    };
    let claims = (0..EVENTS).map(|i| {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move { store.claim(&key(&format!("evt_{i}")), "fp", LONG).await })
    });
    let mut tokens = Vec::new();
    for claim in claims.collect::<Vec<_>>() {
        tokens.push(fresh(claim.await.unwrap().unwrap()));
    }
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();

    let completions = tokens.into_iter().enumerate().map(|(i, token)| {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move {
            let key = key(&format!("evt_{i}"));
            store.complete(&key, &token, &body(i), LONG).await
        })
    });
    for completion in completions.collect::<Vec<_>>() {
        assert!(completion.await.unwrap().unwrap());
    }
    let duplicates = (0..EVENTS).map(|i| {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move { store.claim(&key(&format!("evt_{i}")), "fp", LONG).await })
    });
    for (i, duplicate) in duplicates.collect::<Vec<_>>().into_iter().enumerate() {
        let claim = duplicate.await.unwrap().unwrap();
        assert_eq!(
            claim,
            Claim::Existing(Existing::Completed(body(i))),
            "evt_{i}"
        );
    }
}

/// Redis busy for 300 ms (a script that spins): the first claim's batch is
/// out, a second claim waits behind it, and its caller gives up. When the
/// batch is answered, the given-up claim is not sent, so it leaves no lease
/// that nobody will complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_whose_caller_gave_up_is_not_sent() {
    const SPIN: &str = "
local start = redis.call('TIME')
while true do
  local now = redis.call('TIME')
  if (now[1] - start[1]) * 1000000 + (now[2] - start[2]) > 300000 then return 1 end
end";
    let server = RedisServer::start();
    let store = std::sync::Arc::new(open_redis(&server.url()).await);
    let mut probe = raw(&server).await;
    let mut raw = raw(&server).await;
    let busy = tokio::spawn(async move {
        redis::cmd("EVAL")
            .arg(SPIN)
            .arg(0)
            .query_async::<i64>(&mut raw)
            .await
    });
    // Wait until it most likely spins: a PING on another connection is
    // not answered within 30 ms (a starved runner can also delay it, and
    // then the script is at most that much behind).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while let Ok(pong) = tokio::time::timeout(
        std::time::Duration::from_millis(30),
        redis::cmd("PING").query_async::<String>(&mut probe),
    )
    .await
    {
        pong.expect("the probe's PING");
        assert!(
            !busy.is_finished(),
            "the script ended before it was seen spinning"
        );
        assert!(tokio::time::Instant::now() < deadline, "redis never spun");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let first = {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move { store.claim(&key("evt_first"), "fp", LONG).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        store.claim(&key("evt_gave_up"), "fp", LONG),
    )
    .await;
    assert!(gave_up.is_err(), "the claim was answered while redis spun");

    assert_eq!(busy.await.unwrap().unwrap(), 1);
    fresh(first.await.unwrap().unwrap());
    assert_eq!(store.get(&key("evt_gave_up")).await.unwrap(), None);
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
    let store = Store::open(&RedisServer::settings(url)).await.unwrap();
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
    until_ping_answers::<RedisServer>(&store).await;
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
}
