-- setnx release: delete the lock only if ARGV[1] still holds it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
