-- wrk script for bench/server.py: POST a fixed AdmissionReview body and report
-- the result as one machine-readable line (latencies in microseconds).
--
--   BENCH_BODY=review.json wrk -t1 -c16 -d10s -s bench/load.lua https://127.0.0.1:8443/mutate

local path = os.getenv("BENCH_BODY")
if path == nil then
  error("BENCH_BODY must name the request body file")
end
local file = assert(io.open(path, "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests": %d, "duration_us": %d, "connect_errors": %d, "read_errors": %d, '
      .. '"write_errors": %d, "status_errors": %d, "timeouts": %d, '
      .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
