-- Redisson's read unlock, as RedissonReadLock.unlockInnerAsync sends it.
-- KEYS: the rwlock hash, its channel, this holder's timeout prefix, the key
-- prefix of all holders' timeouts, this unlock's latch (a resent unlock
-- answers what the first one did).
-- ARGV: unlock message (0), lock name, publish command, latch ms.
local val = redis.call('get', KEYS[5]);
if val ~= false then
    return tonumber(val);
end;
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
    redis.call(ARGV[3], KEYS[2], ARGV[1]);
    redis.call('set', KEYS[5], 1, 'px', ARGV[4]);
    return nil;
end;
local lockExists = redis.call('hexists', KEYS[1], ARGV[2]);
if (lockExists == 0) then
    return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1);
if (counter == 0) then
    redis.call('hdel', KEYS[1], ARGV[2]);
end;
redis.call('del', KEYS[3] .. ':' .. (counter+1));
-- other holders left: the hash lives as long as their longest hold timeout
if (redis.call('hlen', KEYS[1]) > 1) then
    local maxRemainTime = -3;
    local keys = redis.call('hkeys', KEYS[1]);
    for n, key in ipairs(keys) do
        counter = tonumber(redis.call('hget', KEYS[1], key));
        if type(counter) == 'number' then
            for i=counter, 1, -1 do
                local remainTime = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i);
                maxRemainTime = math.max(remainTime, maxRemainTime);
            end;
        end;
    end;
    if maxRemainTime > 0 then
        redis.call('pexpire', KEYS[1], maxRemainTime);
        redis.call('set', KEYS[5], 0, 'px', ARGV[4]);
        return 0;
    end;
    if mode == 'write' then
        redis.call('set', KEYS[5], 0, 'px', ARGV[4]);
        return 0;
    end;
end;
redis.call('del', KEYS[1]);
redis.call(ARGV[3], KEYS[2], ARGV[1]);
redis.call('set', KEYS[5], 1, 'px', ARGV[4]);
return 1;
