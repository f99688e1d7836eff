//! The redis backend: the store shared by several replicas.
//!
//! Each key is one string, `{prefix}:{provider}:{key}` (its layout in
//! `value`), whose TTL is the lease while in flight and the retention once
//! completed, so redis expires keys itself. A claim is one `SET NX PX GET`,
//! which is atomic and exclusive across replicas; completing and releasing
//! compare the lease's owner first, in a Lua script (redis runs a script
//! atomically). One key per command keeps the backend Redis Cluster
//! compatible. Keys written as hashes by earlier versions are still read.
//!
//! A provider in queue mode keeps its keys in one of the outbox's shards
//! instead, `{prefix}:{qNN}:{provider}:{key}` (braces literal: a hash tag),
//! so that an accept writes the dedupe entry and the job in one script on
//! one slot (see `outbox`).

mod batch;
mod connection;
mod outbox;
mod value;

use std::collections::HashSet;
use std::sync::LazyLock;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use redis::{ErrorKind, RedisError, Script};

use self::connection::{Conn, Link};

use super::Result;
use super::{Backend, Claim, Existing, KeyRecord, LeaseToken, ScopedKey, Snapshot, StoreError};

/// Reads a live hash (a queue-mode dedupe entry, or a forward-mode key
/// written before values became strings) as {state, fingerprint, PTTL,
/// status, content type, body, truncated}; nil fields come back as nil
/// (HMGET's `false`), not as holes.
const READ_HASH: &str = "
local f = redis.call('HMGET', KEYS[1], 'state', 'fp', 'status', 'ctype', 'body', 'cut')
return {'hash', f[1], f[2], tostring(redis.call('PTTL', KEYS[1])), f[3], f[4], f[5], f[6]}
";

/// Either layout, for `keys get`: {'string', value, PTTL}, the hash's
/// fields after 'hash', or nothing.
const GET: &str = "
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'string' then
  return {'string', redis.call('GET', KEYS[1]), tostring(redis.call('PTTL', KEYS[1]))}
end
if kind ~= 'hash' then
  return {}
end
";

/// ARGV: the owner's prefix (`value::owner`), retention (ms), the completed
/// value's head and tail; the fingerprint between them is the claim's.
const COMPLETE: &str = "
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
local fp = string.match(v, '^[^:]*:[^:]*:(.*)$')
redis.call('SET', KEYS[1], ARGV[3] .. fp .. ARGV[4], 'PX', ARGV[2])
return 1
";

/// ARGV: the owner's prefix.
const RELEASE: &str = "
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
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
    complete: Script,
    release: Script,
    get: Script,
}

/// Compiled (hashed) once per process.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    complete: Script::new(COMPLETE),
    release: Script::new(RELEASE),
    get: Script::new(&format!("{GET}{READ_HASH}")),
});

/// The fields `READ_HASH` returns after its tag, in order.
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
            // Joined, not `format!`ted, as the values are (`value`).
            [self.prefix.as_str(), ":", &key.provider, ":", &key.key].concat()
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
    /// One plain `SET NX PX GET` (Redis 7.0 or later): it takes a missing
    /// key and returns a held one's value, so neither a fresh event nor a
    /// duplicate runs a script.
    async fn claim(&self, key: &ScopedKey, fingerprint: &str, lease: Duration) -> Result<Claim> {
        let token = LeaseToken::generate();
        let name = self.key(key);
        loop {
            let held: Option<Vec<u8>> = redis::cmd("SET")
                .arg(&name)
                .arg(value::in_flight(&token, fingerprint, lease))
                .arg("NX")
                .arg("PX")
                .arg(millis(lease))
                .arg("GET")
                .query_async(&mut self.conn().await?)
                .await
                .or_else(|e| match e.code() {
                    // A hash from before values were strings (no value of
                    // ours is empty): read it as it is.
                    Some("WRONGTYPE") => Ok(Some(Vec::new())),
                    _ => Err(self.error(e)),
                })?;
            let (stored, existing) = match held {
                None => return Ok(Claim::Fresh(token)),
                Some(value) if !value.is_empty() => value::decode(&value)?,
                Some(_) => match self.get(key).await? {
                    Some(record) => (record.fingerprint, record.state),
                    // It expired between the two calls: claim again.
                    None => continue,
                },
            };
            return Ok(Claim::held(&stored, fingerprint, existing));
        }
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
            .arg(value::owner(token))
            .arg(millis(retention))
            .arg(value::completed_head(snapshot))
            .arg(value::completed_tail(snapshot))
            .invoke_async(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        Ok(acted == 1)
    }

    async fn release(&self, key: &ScopedKey, token: &LeaseToken) -> Result<bool> {
        let acted: i64 = SCRIPTS
            .release
            .key(self.key(key))
            .arg(value::owner(token))
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
        let (fingerprint, state, pttl) = decode_tagged(fields)?;
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

/// Turns what the `GET` script returns of a live key into (fingerprint,
/// state, PTTL): a string's value, or a hash's fields.
fn decode_tagged(mut fields: Fields) -> Result<(String, Existing, Option<Vec<u8>>)> {
    let tag = fields.remove(0);
    // PTTL: the string's second field, the hash's third.
    let pttl = |at: usize| fields.get(at).cloned().flatten();
    if tag.as_deref() == Some(b"string") {
        let value = pttl(0).unwrap_or_default();
        let (fingerprint, state) = value::decode(&value)?;
        return Ok((fingerprint, state, pttl(1)));
    }
    let ttl = pttl(2);
    let (fingerprint, state) = decode(fields)?;
    Ok((fingerprint, state, ttl))
}

/// Turns `READ_HASH`'s fields (after its tag) into (fingerprint, state).
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
