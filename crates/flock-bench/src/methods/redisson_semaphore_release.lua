-- Redisson's semaphore release, as RedissonSemaphore.releaseAsync sends it:
-- publishes the permits now free to every waiter.
-- KEYS: the permit counter, the channel. ARGV: permits, publish command.
local value = redis.call('incrby', KEYS[1], ARGV[1]);
redis.call(ARGV[2], KEYS[2], value);
