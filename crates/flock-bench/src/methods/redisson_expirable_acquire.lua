-- Redisson's expirable-permit tryAcquire, as
-- RedissonPermitExpirableSemaphore.tryAcquireAsync(ids, timeoutDate) sends it.
-- KEYS: the free-permit counter, the sorted set permit id -> expiry, the channel.
-- ARGV: permits, expiry (unix ms), now (unix ms), the "never expires" score,
-- publish command, the new permit ids.
-- 'OK': acquired; ':<expiry>': the nearest expiry to wait for; nil: none.
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1]);
if #expiredIds > 0 then
    redis.call('zrem', KEYS[2], unpack(expiredIds));
    local value = redis.call('incrby', KEYS[1], #expiredIds);
    if tonumber(value) > 0 then
        redis.call(ARGV[5], KEYS[3], value);
    end;
end;
local value = redis.call('get', KEYS[1]);
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
    redis.call('decrby', KEYS[1], ARGV[1]);
    for i = 6, #ARGV, 1 do
        redis.call('zadd', KEYS[2], ARGV[2], ARGV[i]);
    end;
    local ttl = redis.call('pttl', KEYS[1]);
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl);
    end;
    return 'OK';
end;
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES');
if v[1] ~= nil and v[2] ~= ARGV[4] then
    return ':' .. tostring(v[2]);
end
return nil;
