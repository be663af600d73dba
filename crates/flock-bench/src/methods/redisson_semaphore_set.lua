-- Redisson's trySetPermits, as RedissonSemaphore.trySetPermitsAsync (and
-- RedissonPermitExpirableSemaphore.trySetPermitsAsync, the same script) sends it.
-- KEYS: the permit counter, the channel. ARGV: permits, publish command.
local value = redis.call('get', KEYS[1]);
if (value == false) then
    redis.call('set', KEYS[1], ARGV[1]);
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return 1;
end;
return 0;
