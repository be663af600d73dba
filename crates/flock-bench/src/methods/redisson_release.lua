-- redisson release, after Redisson's RedissonFairLock.unlockInnerAsync.
-- KEYS: lock hash, queue list, timeout zset, channel prefix.
-- ARGV: lease ms, owner, unlock message, now ms.
-- Wakes only the waiter at the head, on its own channel.
local function wake_head()
    local head = redis.call('LINDEX', KEYS[2], 0)
    if head then
        redis.call('PUBLISH', KEYS[4] .. ':' .. head, ARGV[3])
    end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
    wake_head()
    return 1
end
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then
    return nil
end
if redis.call('HINCRBY', KEYS[1], ARGV[2], -1) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
    return 0
end
redis.call('DEL', KEYS[1])
wake_head()
return 1
