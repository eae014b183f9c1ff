/**
 * The Redis scripts of the engine-backed store (engine_store.ts). Each write is one script, so it
 * is atomic across every server of the engine: it reads what it needs, checks the session's
 * quotas (keys, bytes), writes, refreshes the session's expiry and publishes the keys written
 * on the session's channel (which wakes the waiters of every server). A session's data is two
 * keys with one hash tag: `ddp:{S}:kv` (a hash: store key -> value) and `ddp:{S}:n` (the bytes it
 * holds, keys' and values'). Refusals come back as `{code, detail}` for the caller to word.
 */

/** KEYS: kv, n. ARGV: maxKeys, maxBytes, ttlMs, channel, op, then op's arguments. */
export const WRITE_LUA = `
local kv, nk = KEYS[1], KEYS[2]
local maxKeys, maxBytes, ttl, channel, op = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local writes = {}
local result = ''
if op == 'set' then
  writes[1] = {ARGV[6], ARGV[7]}
elseif op == 'multiSet' then
  for i = 6, #ARGV, 2 do writes[#writes + 1] = {ARGV[i], ARGV[i + 1]} end
elseif op == 'append' then
  local cur = redis.call('HGET', kv, ARGV[6]) or ''
  writes[1] = {ARGV[6], cur .. ARGV[7]}
elseif op == 'add' then
  local cur = redis.call('HGET', kv, ARGV[6])
  local base = 0
  if cur then
    local t = string.match(cur, '^%s*([+-]?%d+)%s*$')
    if not t then return {'NOT_AN_INTEGER', string.sub(cur, 1, 40)} end
    base = tonumber(t)
  end
  local nxt = base + tonumber(ARGV[7])
  if math.abs(nxt) > 9007199254740991 then return {'OVERFLOW', tostring(base)} end
  if nxt == 0 then nxt = 0 end
  result = string.format('%.0f', nxt)
  writes[1] = {ARGV[6], result}
elseif op == 'cas' then
  local cur = redis.call('HGET', kv, ARGV[6])
  if not cur then
    if ARGV[7] ~= '' then return {'VALUE', ARGV[7]} end
  elseif cur ~= ARGV[7] then
    return {'VALUE', cur}
  end
  result = ARGV[8]
  writes[1] = {ARGV[6], ARGV[8]}
else
  return {'BAD_OP', op}
end
local keys = redis.call('HLEN', kv)
local bytes = tonumber(redis.call('GET', nk) or '0')
local delta = 0
for _, w in ipairs(writes) do
  if redis.call('HEXISTS', kv, w[1]) == 1 then
    delta = delta + #w[2] - redis.call('HSTRLEN', kv, w[1])
  else
    keys = keys + 1
    delta = delta + #w[1] + #w[2]
  end
end
if keys > maxKeys then return {'QUOTA_KEYS', tostring(keys)} end
if bytes + delta > maxBytes then return {'QUOTA_BYTES', tostring(bytes + delta)} end
local names = {}
for i, w in ipairs(writes) do
  redis.call('HSET', kv, w[1], w[2])
  names[i] = w[1]
end
redis.call('INCRBY', nk, delta)
redis.call('PEXPIRE', kv, ttl)
redis.call('PEXPIRE', nk, ttl)
redis.call('PUBLISH', channel, cjson.encode(names))
return {'OK', result}
`;

/** KEYS: kv, n. ARGV: key. Returns 1 when it was there. */
export const DELETE_LUA = `
local kv, nk = KEYS[1], KEYS[2]
if redis.call('HEXISTS', kv, ARGV[1]) == 0 then return 0 end
local len = redis.call('HSTRLEN', kv, ARGV[1])
redis.call('HDEL', kv, ARGV[1])
redis.call('DECRBY', nk, #ARGV[1] + len)
return 1
`;

/** KEYS: kv. ARGV: keys. Returns 1 per key that exists, 0 per missing one. */
export const EXISTS_LUA = `
local out = {}
for i, k in ipairs(ARGV) do out[i] = redis.call('HEXISTS', KEYS[1], k) end
return out
`;

/** KEYS: auth. ARGV: token hash (hex), host hash (hex, '' for none), ttlMs. Fixes both unless set; returns the kept pair. */
export const CLAIM_AUTH_LUA = `
if redis.call('HEXISTS', KEYS[1], 'token') == 0 then
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'host', ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('HMGET', KEYS[1], 'token', 'host')
`;
