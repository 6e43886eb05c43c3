-- wrk script: POST the Open Inference Protocol body in the file named by
-- $BENCH_BODY (JSON text, then binary tensors), whose JSON text is
-- $BENCH_JSON_LEN bytes long.
--   BENCH_BODY=build/bench/oip_h8_n512.bin BENCH_JSON_LEN=$(cat build/bench/oip_h8_n512.len) \
--     wrk -t1 -c16 -d5s -s bench/oip_body.lua http://127.0.0.1:8080/v2/models/attention/infer
local path = os.getenv("BENCH_BODY")
local f = assert(io.open(path, "rb"), "cannot open BENCH_BODY " .. tostring(path))
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = assert(os.getenv("BENCH_JSON_LEN"),
                                                        "BENCH_JSON_LEN is not set")
wrk.body = f:read("*a")
f:close()
