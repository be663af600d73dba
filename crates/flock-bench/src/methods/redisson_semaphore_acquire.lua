-- Redisson's semaphore tryAcquire, as RedissonSemaphore.tryAcquireAsync0 sends it.
-- KEYS: the permit counter. ARGV: permits. 1: acquired, 0: not enough free.
local value = redis.call('get', KEYS[1]);
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
    local val = redis.call('decrby', KEYS[1], ARGV[1]);
    return 1;
end;
return 0;
