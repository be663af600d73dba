-- listpoll release: if ARGV[1] holds the lock KEYS[1], delete it and leave
-- the head of the queue KEYS[2], so that the next waiter's poll can take it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('LPOP', KEYS[2])
    return 1
end
return 0
