-- wrk script: ThingsBoard HTTP device API, one access token per simulated device.
-- Each request posts ~120 bytes of JSON with 5 values for the next device in turn, with its
-- own timestamp (storage keys points by device, key and ts: requests stamped by the server
-- within the same millisecond would merge into one point and flatter the figures).
-- Usage: wrk -t1 -c100 -d20s -s bench/http_telemetry.lua http://127.0.0.1:PORT -- DEVICES
local devices = 100
local counter = 0
ok, bad = 0, 0  -- globals, so done() can read them with thread:get

function init(args)
  if args[1] then devices = tonumber(args[1]) end
  if args[2] then thread_count = tonumber(args[2]) end
end

function request()
  counter = counter + 1
  local d = counter % devices
  -- unique per request across wrk threads: thread_id + counter * thread_count
  local ts = 1700000000000 + thread_id + counter * thread_count
  local body = string.format(
    '{"ts":%d,"values":{"temperature":%d.5,"humidity":%d,"pressure":1013.25,"battery":%d,"status":"ok"}}',
    ts, 20 + counter % 10, 40 + counter % 20, 90 + counter % 10)
  return wrk.format("POST", "/api/v1/BENCH" .. d .. "/telemetry",
    {["Content-Type"] = "application/json"}, body)
end

local threads = {}
thread_id, thread_count = 0, 1

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_id", #threads - 1)
end

function response(status, headers, body)
  if status == 200 then ok = ok + 1 else bad = bad + 1 end
end

function done(summary, latency, requests)
  local acked, failed = 0, 0
  for _, t in ipairs(threads) do
    acked = acked + t:get("ok")
    failed = failed + t:get("bad")
  end
  io.write(string.format("ACKED %d FAILED %d\n", acked, failed))
  io.write(string.format("LATENCY_US p50 %d p99 %d max %d\n",
    latency:percentile(50), latency:percentile(99), latency.max))
end
