-- Both redisson scripts start here: drop queue heads whose wait timed out
-- (ARGV[4] is the caller's clock, in ms).
while true do
    local head = redis.call('LINDEX', KEYS[2], 0)
    if head == false then
        break
    end
    if tonumber(redis.call('ZSCORE', KEYS[3], head)) <= tonumber(ARGV[4]) then
        redis.call('ZREM', KEYS[3], head)
        redis.call('LPOP', KEYS[2])
    else
        break
    end
end
