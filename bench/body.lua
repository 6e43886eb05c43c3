-- wrk script: POST the file named by $BENCH_BODY as application/json.
--   BENCH_BODY=build/bench/small.json wrk -t1 -c16 -d5s -s bench/body.lua URL
local path = os.getenv("BENCH_BODY")
local f = assert(io.open(path, "rb"), "cannot open BENCH_BODY " .. tostring(path))
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = f:read("*a")
f:close()
