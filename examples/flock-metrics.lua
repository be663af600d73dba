-- FLOCK's `INFO flock` for redis_exporter's --script option (its
-- --include-modules-metrics exports only the fields it knows by name, none
-- of FLOCK's): every field as a name and a value, each distribution as one
-- field per percentile (flock_wait_percentiles_usec_p99_9, ...). The
-- exporter shows them as redis_script_values{key="flock_...",filename=...};
-- docs/observability.md says which are counters, gauges and percentiles.
local out = {}
for line in string.gmatch(redis.call('INFO', 'flock'), '[^\r\n]+') do
  local name, value = string.match(line, '^(flock_[%w_]+):(.+)$')
  if name and string.find(value, '=', 1, true) then
    for p, v in string.gmatch(value, '([%w%.]+)=([%d%.]+)') do
      table.insert(out, name .. '_' .. (string.gsub(p, '%.', '_')))
      table.insert(out, v)
    end
  elseif name then
    table.insert(out, name)
    table.insert(out, value)
  end
end
return out
