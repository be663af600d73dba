-- Redisson's write unlock, as RedissonWriteLock.unlockInnerAsync sends it.
-- KEYS: the rwlock hash, its channel, this unlock's latch.
-- ARGV: read-unlock message (1: wakes every waiter), lease ms, write lock
-- name, publish command, latch ms.
local val = redis.call('get', KEYS[3]);
if val ~= false then
    return tonumber(val);
end;
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
    redis.call(ARGV[4], KEYS[2], ARGV[1]);
    redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
    return nil;
end;
if (mode == 'write') then
    local lockExists = redis.call('hexists', KEYS[1], ARGV[3]);
    if (lockExists == 0) then
        return nil;
    else
        local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
        if (counter > 0) then
            redis.call('pexpire', KEYS[1], ARGV[2]);
            redis.call('set', KEYS[3], 0, 'px', ARGV[5]);
            return 0;
        else
            redis.call('hdel', KEYS[1], ARGV[3]);
            if (redis.call('hlen', KEYS[1]) == 1) then
                redis.call('del', KEYS[1]);
                redis.call(ARGV[4], KEYS[2], ARGV[1]);
            else
                -- has unlocked read-locks
                redis.call('hset', KEYS[1], 'mode', 'read');
            end;
            redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
            return 1;
        end;
    end;
end;
return nil;
