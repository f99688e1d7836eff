//! The outbox's Lua scripts. Each runs on one shard: its keys share the
//! shard's hash tag, so each script touches one Redis Cluster slot. A job's
//! hash is named from the shard's prefix and the job id inside the script
//! (ARGV, not KEYS): it is on the same slot, which is what a cluster checks.
//!
//! Every script reads the server's clock (`TIME`), so the due times and
//! leases of all gates agree whatever their own clocks say.

use std::sync::LazyLock;

use redis::Script;

/// `now` in milliseconds on the server's clock, and `int` to write a number
/// as redis expects it (Lua's `tostring` would switch to exponents).
const PRELUDE: &str = "
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function int(x) return string.format('%d', x) end
";

/// KEYS: due, jobs, seq, then the dedupe key of each item. ARGV: the job key
/// prefix, the shard, '1' to write (else only check), '1' to reject a
/// mismatch, the retention (ms), the answer's status, '1' if a content type
/// follows, the content type, the body, '1' if truncated; then per item its
/// fingerprint, provider, key, method, target, headers, body.
///
/// Returns {written, per item: {} when new, else what the store's `GET`
/// script returns of it}.
/// Checks everything before the first write, including the shape of every
/// key it will write, so no command can fail once writing began (redis does
/// not roll a script back); the outbox is written first and the dedupe
/// entries last, so that even an unforeseen failure leaves no entry
/// without its job.
const ACCEPT: &str = "
local function shape(key, want)
  local got = redis.call('TYPE', key)['ok']
  if got ~= 'none' and got ~= want then
    return 'hookgate outbox: ' .. key .. ' holds a ' .. got .. ', not a ' .. want
  end
end
local broken = shape(KEYS[1], 'zset') or shape(KEYS[2], 'zset') or shape(KEYS[3], 'string')
if broken then return redis.error_reply(broken) end
local n, out, fresh, blocked = #KEYS - 3, {}, {}, false
for i = 1, n do
  local k, fp = KEYS[3 + i], ARGV[4 + i * 7]
  local kind, state, stored = redis.call('TYPE', k)['ok'], nil, ''
  if kind == 'none' then
    out[i] = {}
    fresh[#fresh + 1] = i
  elseif kind == 'string' then
    -- A forward-mode claim's value (see the store's `value` module).
    local v = redis.call('GET', k)
    out[i] = {'string', v}
    if string.sub(v, 1, 1) == 'c' then
      state, stored = 'completed', string.match(v, '^[^:]*:([^:]*):') or ''
    end
  else
    local f = redis.call('HMGET', k, 'state', 'fp', 'status', 'ctype', 'body', 'cut')
    out[i] = {'hash', f[1], f[2], tostring(redis.call('PTTL', k)), f[3], f[4], f[5], f[6]}
    state, stored = f[1], f[2] or ''
  end
  if kind == 'none' then
  elseif state ~= 'completed' then
    blocked = true
  elseif ARGV[4] == '1' and stored ~= '' and fp ~= '' and stored ~= fp then
    blocked = true
  end
end
if blocked or ARGV[3] ~= '1' or #fresh == 0 then return {0, out} end
local seq, shard = tonumber(redis.call('GET', KEYS[3]) or '0'), tonumber(ARGV[2])
for j = 1, #fresh do
  local jk = ARGV[1] .. int((seq + j) * 16 + shard)
  if redis.call('EXISTS', jk) == 1 then
    return redis.error_reply('hookgate outbox: ' .. jk .. ' exists already')
  end
end
redis.call('INCRBY', KEYS[3], #fresh)
local expires = int(now + tonumber(ARGV[5]))
for j, i in ipairs(fresh) do
  local id, a = int((seq + j) * 16 + shard), 4 + i * 7
  redis.call('HSET', ARGV[1] .. id, 'provider', ARGV[a + 1], 'key', ARGV[a + 2],
    'state', 'pending', 'method', ARGV[a + 3], 'target', ARGV[a + 4],
    'headers', ARGV[a + 5], 'body', ARGV[a + 6], 'received_at', int(now),
    'due_at', int(now), 'attempts', '0', 'expires_at', expires)
  redis.call('ZADD', KEYS[2], int(now), id)
  redis.call('ZADD', KEYS[1], int(now), id)
end
for _, i in ipairs(fresh) do
  local k = KEYS[3 + i]
  redis.call('HSET', k, 'state', 'completed', 'fp', ARGV[4 + i * 7], 'status', ARGV[6],
    'body', ARGV[9], 'cut', ARGV[10])
  if ARGV[7] == '1' then redis.call('HSET', k, 'ctype', ARGV[8]) end
  redis.call('PEXPIRE', k, ARGV[5])
end
return {1, out}
";

/// KEYS: due. How many jobs are due now.
const COUNT_DUE: &str = "
return redis.call('ZCOUNT', KEYS[1], '-inf', int(now))
";

/// KEYS: due. ARGV: the job key prefix, the lease (ms), the limit, the
/// token. A job's score in `due` is when it may next be taken: its due time,
/// or while leased its lease's end, so an expired lease is due again with
/// no other step. Returns per job {id, attempt, provider, key, method,
/// target, headers, body, received_at}.
const TAKE: &str = "
local lease_end = int(now + tonumber(ARGV[2]))
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local jk = ARGV[1] .. id
  if redis.call('HGET', jk, 'state') ~= 'pending' then
    redis.call('ZREM', KEYS[1], id)
  else
    redis.call('ZADD', KEYS[1], lease_end, id)
    local attempt = redis.call('HINCRBY', jk, 'attempts', 1)
    redis.call('HSET', jk, 'token', ARGV[4], 'lease_until', lease_end)
    local f = redis.call('HMGET', jk, 'provider', 'key', 'method', 'target', 'headers', 'body',
      'received_at')
    out[#out + 1] = {id, tostring(attempt), f[1], f[2], f[3], f[4], f[5], f[6], f[7]}
  end
end
return out
";

/// KEYS: the job, due, dead. ARGV: token, the new state (pending,
/// delivered, dead), the wait before a retry (ms), the status or '', '1'
/// if an error follows, the error, the id. A compare-and-set on the token.
const SETTLE: &str = "
local f = redis.call('HMGET', KEYS[1], 'state', 'token')
if f[1] ~= 'pending' or f[2] ~= ARGV[1] then return 0 end
local id = ARGV[7]
redis.call('HDEL', KEYS[1], 'token', 'lease_until')
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[1], 'last_status')
else
  redis.call('HSET', KEYS[1], 'last_status', ARGV[4])
end
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'last_error', ARGV[6])
else
  redis.call('HDEL', KEYS[1], 'last_error')
end
if ARGV[2] == 'pending' then
  local due = int(now + tonumber(ARGV[3]))
  redis.call('HSET', KEYS[1], 'due_at', due)
  redis.call('HDEL', KEYS[1], 'finished_at')
  redis.call('ZADD', KEYS[2], due, id)
  return 1
end
redis.call('ZREM', KEYS[2], id)
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'due_at', int(now), 'finished_at', int(now))
if ARGV[2] == 'dead' then
  redis.call('ZADD', KEYS[3], redis.call('HGET', KEYS[1], 'received_at'), id)
else
  redis.call('PEXPIREAT', KEYS[1], redis.call('HGET', KEYS[1], 'expires_at'))
end
return 1
";

/// KEYS: due, dead, jobs. ARGV: the operation (list, replay, purge), the
/// job key prefix, the state wanted or '', '=provider' or '', '=key' or '',
/// the lowest received time ('-inf' or ms), the highest ('+inf' or '(ms'),
/// the limit (list only; -1 for none). Walks the received-time index newest
/// first (the dead letter's own index for state dead), dropping ids whose
/// job expired. A listing goes on past the limit while the received time
/// ties, so the caller's merge of the shards cuts at the right job.
const SCAN: &str = "
local op, prefix, state = ARGV[1], ARGV[2], ARGV[3]
local function wanted(filter, value) return filter == '' or filter == '=' .. (value or '') end
local index = KEYS[3]
if state == 'dead' then index = KEYS[2] end
local limit = tonumber(ARGV[8])
local hits, gone, offset, last, stop = {}, {}, 0, nil, false
while not stop do
  local page = redis.call('ZREVRANGEBYSCORE', index, ARGV[7], ARGV[6], 'WITHSCORES', 'LIMIT',
    offset, 256)
  if #page == 0 then break end
  offset = offset + #page / 2
  for p = 1, #page, 2 do
    local id, score = page[p], page[p + 1]
    if op == 'list' and #hits >= limit and score ~= last then
      stop = true
      break
    end
    local f = redis.call('HMGET', prefix .. id, 'state', 'provider', 'key')
    if not f[1] then
      gone[#gone + 1] = id
    elseif (state == '' or f[1] == state) and wanted(ARGV[4], f[2]) and wanted(ARGV[5], f[3]) then
      hits[#hits + 1] = id
      last = score
    end
  end
end
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
if op == 'list' then
  local out = {}
  for _, id in ipairs(hits) do
    local f = redis.call('HMGET', prefix .. id, 'provider', 'key', 'state', 'attempts',
      'received_at', 'due_at', 'last_status', 'last_error')
    out[#out + 1] = {id, f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]}
  end
  return out
end
for _, id in ipairs(hits) do
  local jk = prefix .. id
  if op == 'replay' then
    redis.call('HSET', jk, 'state', 'pending', 'due_at', int(now), 'attempts', '0')
    redis.call('HDEL', jk, 'token', 'lease_until', 'finished_at')
    redis.call('PERSIST', jk)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZADD', KEYS[1], int(now), id)
  else
    redis.call('DEL', jk)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
  end
end
return #hits
";

/// KEYS: due, dead. ARGV: the job key prefix, the set to walk ('1' due,
/// '2' dead), the first rank, the page's size. Reads one page of the set's
/// ids (one hash read each), so that a long backlog never holds the server
/// for long: the caller walks each set page by page (`DEPTH_PAGE`). Returns
/// {{ids walked}, then per provider {provider, pending, leased, dead,
/// oldest pending received time or nil}} for the page.
const DEPTH: &str = "
local by, order = {}, {}
local function entry(p)
  if not by[p] then
    by[p] = {p, 0, 0, 0, false}
    order[#order + 1] = p
  end
  return by[p]
end
local set, first = tonumber(ARGV[2]), tonumber(ARGV[3])
local ids = redis.call('ZRANGE', KEYS[set], first, first + tonumber(ARGV[4]) - 1)
for _, id in ipairs(ids) do
  if set == 1 then
    local f = redis.call('HMGET', ARGV[1] .. id, 'state', 'provider', 'received_at', 'lease_until')
    if f[1] == 'pending' and f[2] then
      local e = entry(f[2])
      if f[4] and tonumber(f[4]) > now then e[3] = e[3] + 1 else e[2] = e[2] + 1 end
      local received = tonumber(f[3])
      if received and (not e[5] or received < e[5]) then e[5] = received end
    end
  else
    local f = redis.call('HMGET', ARGV[1] .. id, 'state', 'provider')
    if f[1] == 'dead' and f[2] then
      local e = entry(f[2])
      e[4] = e[4] + 1
    end
  end
end
local out = {{int(#ids)}}
for _, p in ipairs(order) do
  local e = by[p]
  out[#out + 1] = {e[1], int(e[2]), int(e[3]), int(e[4]), e[5] and int(e[5]) or false}
end
return out
";

pub(super) struct Scripts {
    pub accept: Script,
    pub count_due: Script,
    pub take: Script,
    pub settle: Script,
    pub scan: Script,
    pub depth: Script,
}

/// Compiled (hashed) once per process.
pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let with_clock = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
    Scripts {
        accept: with_clock(ACCEPT),
        count_due: with_clock(COUNT_DUE),
        take: with_clock(TAKE),
        settle: with_clock(SETTLE),
        scan: with_clock(SCAN),
        depth: with_clock(DEPTH),
    }
});
