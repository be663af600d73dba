-- listpoll poll: ARGV[1] takes the lock KEYS[1] if it is at the head of the
-- queue KEYS[2] and the lock is free. 1 if it holds it now.
if redis.call('LINDEX', KEYS[2], 0) == ARGV[1]
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
end
return 0
