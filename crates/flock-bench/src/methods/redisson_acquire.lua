-- redisson acquire, after Redisson's RedissonFairLock.tryLockInnerAsync.
-- KEYS: lock hash (owner -> holds), queue list, timeout zset.
-- ARGV: lease ms, owner, thread wait time ms, now ms.
-- nil: the owner holds the lock; otherwise the ms to wait at most.
if redis.call('EXISTS', KEYS[1]) == 0
    and (redis.call('EXISTS', KEYS[2]) == 0 or redis.call('LINDEX', KEYS[2], 0) == ARGV[2]) then
    redis.call('LPOP', KEYS[2])
    redis.call('ZREM', KEYS[3], ARGV[2])
    -- everyone moves up one place: their timeouts move one wait time earlier
    local waiting = redis.call('ZRANGE', KEYS[3], 0, -1)
    for i = 1, #waiting do
        redis.call('ZINCRBY', KEYS[3], -tonumber(ARGV[3]), waiting[i])
    end
    redis.call('HSET', KEYS[1], ARGV[2], 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
    return nil
end
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
    redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
    return nil
end
local queued = redis.call('ZSCORE', KEYS[3], ARGV[2])
if queued ~= false then
    -- approximately the timeout of the waiter in front
    return tonumber(queued) - tonumber(ARGV[3]) - tonumber(ARGV[4])
end
-- join the tail; time out one wait time after the waiter in front (or the lease)
local last = redis.call('LINDEX', KEYS[2], -1)
local ttl
if last ~= false and last ~= ARGV[2] then
    ttl = tonumber(redis.call('ZSCORE', KEYS[3], last)) - tonumber(ARGV[4])
else
    ttl = redis.call('PTTL', KEYS[1])
end
if redis.call('ZADD', KEYS[3], ttl + tonumber(ARGV[3]) + tonumber(ARGV[4]), ARGV[2]) == 1 then
    redis.call('RPUSH', KEYS[2], ARGV[2])
end
return ttl
