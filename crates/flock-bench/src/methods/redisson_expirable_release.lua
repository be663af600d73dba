-- Redisson's expirable-permit release, as
-- RedissonPermitExpirableSemaphore.tryReleaseAsync(permitId) sends it.
-- KEYS: the free-permit counter, the channel, the sorted set of permits.
-- ARGV: permit id, permits (1), now (unix ms), publish command.
-- 1: released; 0: unknown or already expired.
local expire = redis.call('zscore', KEYS[3], ARGV[1]);
local removed = redis.call('zrem', KEYS[3], ARGV[1]);
if tonumber(removed) ~= 1 then
    return 0;
end;
local value = redis.call('incrby', KEYS[1], ARGV[2]);
redis.call(ARGV[4], KEYS[2], value);
if tonumber(expire) <= tonumber(ARGV[3]) then
    return 0;
end;
return 1;
