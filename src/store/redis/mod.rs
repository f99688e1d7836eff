//! The redis backend: the store shared by several replicas.
//!
//! Each key is one hash, `{prefix}:{provider}:{key}`, whose TTL is the lease
//! while in flight and the retention once completed, so redis expires keys
//! itself. Every operation that reads then writes is one Lua script: redis
//! runs a script atomically, which is what makes a claim exclusive across
//! replicas. One key per script keeps the backend Redis Cluster compatible.
//!
//! A provider in queue mode keeps its keys in one of the outbox's shards
//! instead, `{prefix}:{qNN}:{provider}:{key}` (braces literal: a hash tag),
//! so that an accept writes the dedupe entry and the job in one script on
//! one slot (see `outbox`).

mod connection;
mod outbox;

use std::collections::HashSet;
use std::sync::LazyLock;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use redis::{ErrorKind, RedisError, Script};

use self::connection::{Conn, Link};

use super::Result;
use super::{Backend, Claim, Existing, KeyRecord, LeaseToken, ScopedKey, Snapshot, StoreError};

/// Reads a live key as {state, fingerprint, PTTL, status, content type,
/// body, truncated}; nil fields come back as nil (HMGET's `false`), not as
/// holes.
const READ_STATE: &str = "
local f = redis.call('HMGET', KEYS[1], 'state', 'fp', 'status', 'ctype', 'body', 'cut')
return {f[1], f[2], tostring(redis.call('PTTL', KEYS[1])), f[3], f[4], f[5], f[6]}
";

/// ARGV: token, fingerprint, lease (ms). A missing key was never claimed,
/// or its lease or retention ran out: take it.
const CLAIM: &str = "
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'state', 'in_flight', 'token', ARGV[1], 'fp', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'fresh'}
end
";

const GET: &str = "
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
";

/// ARGV: token, retention (ms), status, '1' if a content type follows,
/// content type, body, '1' if the body is truncated.
const COMPLETE: &str = "
local f = redis.call('HMGET', KEYS[1], 'state', 'token')
if f[1] ~= 'in_flight' or f[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[3], 'body', ARGV[6],
  'cut', ARGV[7])
redis.call('HDEL', KEYS[1], 'token')
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'ctype', ARGV[5])
else
  redis.call('HDEL', KEYS[1], 'ctype')
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// ARGV: token.
const RELEASE: &str = "
local f = redis.call('HMGET', KEYS[1], 'state', 'token')
if f[1] == 'in_flight' and f[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// Dedupe state in redis, shared by every replica pointing at it.
pub struct RedisStore {
    link: Link,
    prefix: String,
    /// The URL's password, scrubbed from every error message.
    secret: Option<String>,
    /// Providers in queue mode: their keys live in an outbox shard.
    queue: HashSet<String>,
    /// Where the next `take_due` starts among the shards, so that none
    /// waits behind the others.
    cursor: AtomicUsize,
}

/// `Script` sends EVALSHA and falls back to EVAL (loading the script) when
/// the server does not know it, e.g. after a restart.
struct Scripts {
    claim: Script,
    complete: Script,
    release: Script,
    get: Script,
}

/// Compiled (hashed) once per process.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(&format!("{CLAIM}{READ_STATE}")),
    complete: Script::new(COMPLETE),
    release: Script::new(RELEASE),
    get: Script::new(&format!("{GET}{READ_STATE}")),
});

/// The fields `READ_STATE` returns, in order.
type Fields = Vec<Option<Vec<u8>>>;

impl RedisStore {
    /// Prepares a store for `url` (`redis://`; `rediss://` needs TLS support,
    /// not built in yet). No connection is made here: opening succeeds while
    /// redis is down, and each operation connects (or reconnects) as needed,
    /// each attempt bounded by `op_timeout`.
    pub async fn open(url: &str, prefix: &str, op_timeout: Duration) -> Result<Self> {
        let secret = password_of(url);
        let link = Link::single(url, op_timeout).map_err(|e| unavailable(&e, secret.as_deref()))?;
        Ok(Self::on(link, prefix, secret))
    }

    /// Like [`RedisStore::open`], for a Redis Cluster reached through
    /// `seeds` (one or more of its nodes' URLs; the client discovers the
    /// rest, follows redirections and fails over with the cluster). Every
    /// script touches keys of one slot: one dedupe key, or one outbox
    /// shard's keys under their hash tag.
    pub async fn open_cluster(
        seeds: &[String],
        prefix: &str,
        op_timeout: Duration,
    ) -> Result<Self> {
        let secret = seeds.iter().find_map(|url| password_of(url));
        let link =
            Link::cluster(seeds, op_timeout).map_err(|e| unavailable(&e, secret.as_deref()))?;
        Ok(Self::on(link, prefix, secret))
    }

    fn on(link: Link, prefix: &str, secret: Option<String>) -> Self {
        Self {
            link,
            prefix: prefix.to_owned(),
            secret,
            queue: HashSet::new(),
            cursor: AtomicUsize::new(0),
        }
    }

    /// Puts these providers' keys in the outbox shards (queue mode). A
    /// provider that changes mode starts a fresh dedupe history: its old
    /// keys stay under the other layout until they expire.
    pub fn queue_mode(mut self, providers: impl IntoIterator<Item = String>) -> Self {
        self.queue = providers.into_iter().collect();
        self
    }

    /// The dedupe key: in its outbox shard for a queue-mode provider.
    fn key(&self, key: &ScopedKey) -> String {
        if self.queue.contains(&key.provider) {
            let shard = outbox::Shard::of(key);
            format!("{}{}:{}", shard.prefix(&self.prefix), key.provider, key.key)
        } else {
            format!("{}:{}:{}", self.prefix, key.provider, key.key)
        }
    }

    /// A connection for one operation.
    async fn conn(&self) -> Result<Conn> {
        self.link.conn().await.map_err(|e| self.error(e))
    }

    fn error(&self, err: RedisError) -> StoreError {
        if err.kind() == ErrorKind::AuthenticationFailed {
            self.link.renew();
        }
        match err.kind() {
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
                StoreError::Corrupt(scrubbed(&format!("redis: {err}"), self.secret.as_deref()))
            }
            _ => unavailable(&err, self.secret.as_deref()),
        }
    }
}

impl Backend for RedisStore {
    async fn claim(&self, key: &ScopedKey, fingerprint: &str, lease: Duration) -> Result<Claim> {
        let token = LeaseToken::generate();
        let fields: Fields = SCRIPTS
            .claim
            .key(self.key(key))
            .arg(&token.0)
            .arg(fingerprint)
            .arg(millis(lease))
            .invoke_async(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        if matches!(fields.first(), Some(Some(state)) if state == b"fresh") {
            return Ok(Claim::Fresh(token));
        }
        let (stored, existing) = decode(fields)?;
        Ok(Claim::held(&stored, fingerprint, existing))
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        token: &LeaseToken,
        snapshot: &Snapshot,
        retention: Duration,
    ) -> Result<bool> {
        let acted: i64 = SCRIPTS
            .complete
            .key(self.key(key))
            .arg(&token.0)
            .arg(millis(retention))
            .arg(snapshot.status)
            .arg(if snapshot.content_type.is_some() {
                "1"
            } else {
                "0"
            })
            .arg(snapshot.content_type.as_deref().unwrap_or(""))
            .arg(&snapshot.body[..])
            .arg(if snapshot.truncated { "1" } else { "0" })
            .invoke_async(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        Ok(acted == 1)
    }

    async fn release(&self, key: &ScopedKey, token: &LeaseToken) -> Result<bool> {
        let acted: i64 = SCRIPTS
            .release
            .key(self.key(key))
            .arg(&token.0)
            .invoke_async(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        Ok(acted == 1)
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<KeyRecord>> {
        let fields: Fields = SCRIPTS
            .get
            .key(self.key(key))
            .invoke_async(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        if fields.is_empty() {
            return Ok(None);
        }
        // PTTL (the third field): the retention left, once completed.
        let pttl = fields.get(2).cloned().flatten();
        let (fingerprint, state) = decode(fields)?;
        let expires_in = match state {
            Existing::Completed(_) => pttl
                .and_then(|t| String::from_utf8(t).ok()?.parse::<u64>().ok())
                .map(Duration::from_millis),
            Existing::InFlight { .. } => None,
        };
        Ok(Some(KeyRecord {
            fingerprint,
            state,
            expires_in,
        }))
    }

    async fn forget(&self, key: &ScopedKey) -> Result<bool> {
        let deleted: i64 = redis::cmd("DEL")
            .arg(self.key(key))
            .query_async(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        Ok(deleted > 0)
    }

    async fn ping(&self) -> Result<()> {
        redis::cmd("PING")
            .query_async::<String>(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }
}

/// Turns `READ_STATE`'s fields into (fingerprint, state).
fn decode(fields: Fields) -> Result<(String, Existing)> {
    let mut fields = fields.into_iter();
    let mut next = || fields.next().flatten();
    let (state, fingerprint, pttl) = (next(), next(), next());
    let (status, content_type, body, cut) = (next(), next(), next(), next());
    let text = |field: Option<Vec<u8>>, name: &str| {
        String::from_utf8(field.unwrap_or_default())
            .map_err(|_| StoreError::Corrupt(format!("redis: {name} is not UTF-8")))
    };
    let fingerprint = text(fingerprint, "fingerprint")?;
    let existing = match state.as_deref() {
        Some(b"in_flight") => {
            // PTTL is -1 for a key without TTL, which this store never writes.
            let pttl: i64 = text(pttl, "PTTL")?.parse().unwrap_or(0);
            let remaining = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
            // Retry-After has a one-second resolution: never say zero.
            Existing::InFlight {
                retry_after: remaining.max(Duration::from_secs(1)),
            }
        }
        Some(b"completed") => Existing::Completed(Snapshot {
            status: text(status, "status")?
                .parse()
                .map_err(|_| StoreError::Corrupt("redis: invalid status".into()))?,
            content_type: content_type
                .map(|c| text(Some(c), "content type"))
                .transpose()?,
            body: body.unwrap_or_default().into(),
            truncated: cut.as_deref() == Some(b"1"),
        }),
        _ => {
            return Err(StoreError::Corrupt(
                "redis: key without a known state".into(),
            ));
        }
    };
    Ok((fingerprint, existing))
}

/// A TTL in milliseconds for PEXPIRE, at least 1: PEXPIRE 0 would delete
/// the key at once, so a fresh claim would vanish before its caller used it.
fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn unavailable(err: &RedisError, secret: Option<&str>) -> StoreError {
    StoreError::Unavailable(scrubbed(&format!("redis: {err}"), secret))
}

/// Redis errors do not quote the URL today; scrubbing anyway keeps a future
/// message (or a server echoing an AUTH argument) from leaking the password.
fn scrubbed(message: &str, secret: Option<&str>) -> String {
    match secret {
        Some(secret) => message.replace(secret, "***"),
        None => message.to_owned(),
    }
}

/// The password of `scheme://user:password@host/...`, if any.
fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    let password = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
    (!password.is_empty()).then(|| password.to_owned())
}
