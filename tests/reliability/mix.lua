-- wrk script for the reliability rows (tests/reliability/run.sh): a mix of
-- valid, invalid and oversized requests, each answer checked against the
-- request it answers.
--
--   wrk -t N -c N -s mix.lua URL -- MODE
--
-- Run with one connection per thread (-t equal to -c): a thread's requests
-- and responses then strictly alternate, so the response that arrives is
-- the answer to the request this thread sent last. A request that is sent
-- and never answered (its connection broke) is counted as unanswered when
-- the next one is made.
--
-- MODE: "soak"     every kind below (the server runs with --max-body 64KiB
--                  and --max-work 1e7);
--       "valid"    only requests that must be answered 200 (fail-over);
--       "drain"    as "valid", and 503 shutting_down is also a right answer;
--                  a request still unanswered when wrk stops counts too.
--
-- done() prints one line: "mix: requests=.. answered=.. right=.. wrong=..
-- unanswered=.. 5xx=.. statuses=200:..,400:.." and the first wrong answer.

local function numbers(text)
   local out = {}
   for n in text:gmatch("[-+]?[%d%.]+[eE]?[-+]?%d*") do
      out[#out + 1] = tonumber(n)
   end
   return out
end

-- The "output" member's numbers, in order.
local function output_numbers(body)
   local out = body:match('"output":%s*(%b[])')
   return out and numbers(out) or nil
end

local function close_to(got, want)
   if not got or #got ~= #want then
      return false
   end
   for i = 1, #want do
      if math.abs(got[i] - want[i]) > 1e-5 * math.max(1, math.abs(want[i])) then
         return false
      end
   end
   return true
end

local function error_code(body)
   return body:match('"code":%s*"([%w_]+)"')
end

-- Medium: q = 0, so every score is 0 and, with the causal mask, output row i
-- is the mean of v's rows 0..i. v's entries are multiples of 1/8 (exact in
-- float32); the means are computed here in double. 64 x 16 nested numbers
-- is a body over 4 KiB, which goes through the compute queue.
local N, D = 64, 16
local function v_at(i, j) return ((i * 7 + j * 3) % 17 - 8) / 8 end
local function nested(rows, cols, f)
   local r = {}
   for i = 0, rows - 1 do
      local c = {}
      for j = 0, cols - 1 do c[#c + 1] = tostring(f(i, j)) end
      r[#r + 1] = "[" .. table.concat(c, ",") .. "]"
   end
   return "[" .. table.concat(r, ",") .. "]"
end
local medium_body = '{"q":' .. nested(N, D, function() return 0 end) ..
   ',"k":' .. nested(N, D, function(i, j) return ((i + j) % 5 - 2) / 4 end) ..
   ',"v":' .. nested(N, D, v_at) .. ',"causal":true}'
local medium_want = {}
do
   local sum = {}
   for j = 0, D - 1 do sum[j] = 0 end
   for i = 0, N - 1 do
      for j = 0, D - 1 do
         sum[j] = sum[j] + v_at(i, j)
         medium_want[#medium_want + 1] = sum[j] / (i + 1)
      end
   end
end

-- 600 x 600 scores: about 2.9e7 units of work (meta.work), beyond --max-work
-- 1e7; the medium request is about 5.3e6.
local too_much_work = '{"q":' .. nested(600, 1, function() return 0 end) ..
   ',"k":' .. nested(600, 1, function() return 0 end) ..
   ',"v":' .. nested(600, 1, function() return 0 end) .. '}'
-- Beyond --max-body 64 KiB.
local oversized = '{"q":[' .. string.rep("0,", 40000) .. '0]}'

local function ok_status(want)
   return function(status) return status == want end
end
local function error_is(want_status, want_code)
   return function(status, body)
      return status == want_status and error_code(body) == want_code
   end
end
local function output_is(want)
   return function(status, body)
      return status == 200 and close_to(output_numbers(body), want)
   end
end

local json = {["Content-Type"] = "application/json"}
local kinds = {
   {name = "attention", method = "POST", path = "/v1/attention", headers = json,
    body = '{"q":[[1,0],[0,1]],"k":[[1,0],[0,1]],"v":[[1,2],[3,4]]}',
    -- softmax([1, 0] / sqrt 2) = [0.66976, 0.33024] against v
    check = output_is({1.6604769, 2.660477, 2.339523, 3.339523}), valid = true},
   {name = "medium", method = "POST", path = "/v1/attention", headers = json,
    body = medium_body, check = output_is(medium_want), valid = true},
   {name = "multihead", method = "POST", path = "/v1/multihead", headers = json,
    body = '{"x":[[1,0],[0,1],[1,1]],"w_q":[[1,0],[0,1]],"w_k":[[1,0],[0,1]],' ..
       '"w_v":[[1,0],[0,1]],"num_heads":2,"causal":true}',
    check = output_is({1, 0, 0.5, 0.7310586, 0.84463763, 0.84463763}), valid = true},
   {name = "healthz", method = "GET", path = "/healthz", check = ok_status(200), valid = true},
   {name = "invalid_json", method = "POST", path = "/v1/attention", headers = json,
    body = '{"q":[[1,0],]}', check = error_is(400, "invalid_json")},
   {name = "unknown_field", method = "POST", path = "/v1/attention", headers = json,
    body = '{"q":[[1,0]],"k":[[1,0]],"v":[[1]],"casual":true}',
    check = error_is(400, "unknown_field")},
   {name = "shape_mismatch", method = "POST", path = "/v1/attention", headers = json,
    body = '{"q":[[1,0]],"k":[[1,0,0]],"v":[[1]]}', check = error_is(422, "shape_mismatch")},
   {name = "work_limit", method = "POST", path = "/v1/attention", headers = json,
    body = too_much_work, check = error_is(422, "work_limit")},
   {name = "oversized", method = "POST", path = "/v1/attention", headers = json,
    body = oversized, check = error_is(413, "body_too_large")},
   {name = "not_found", method = "GET", path = "/nope", check = error_is(404, "not_found")},
   {name = "wrong_method", method = "GET", path = "/v1/attention",
    check = error_is(405, "method_not_allowed")},
}

mode = "soak"          -- globals are what done() can read from each thread
pending_now = 0
local plan = {}       -- this thread's kinds, in turn
local turn = 0
local pending = nil   -- the kind sent last, not yet answered
requests, answered, right, wrong, unanswered, server_errors = 0, 0, 0, 0, 0, 0
statuses, first_wrong, first_unanswered = "", "", ""
local by_status = {}

function setup(thread)
   thread:set("id", #(_G.threads or {}) + 1)
   _G.threads = _G.threads or {}
   table.insert(_G.threads, thread)
end

function init(args)
   mode = args[1] or "soak"
   for _, k in ipairs(kinds) do
      if mode == "soak" or k.valid then
         k.request = wrk.format(k.method, k.path, k.headers, k.body)
         plan[#plan + 1] = k
      end
   end
   -- Threads start at different places in the mix.
   turn = (id or 0) % #plan
end

-- wrk calls request() once on its first thread to check the script; that
-- request is never sent.
local checked = false

function request()
   if id == 1 and not checked then
      checked = true
      return plan[turn % #plan + 1].request
   end
   if pending then
      unanswered = unanswered + 1 -- its connection broke; wrk reconnected
      if first_unanswered == "" then first_unanswered = pending.name end
   end
   turn = turn % #plan + 1
   pending = plan[turn]
   pending_now = 1
   requests = requests + 1
   return pending.request
end

function response(status, headers, body)
   local k = pending
   pending = nil
   pending_now = 0
   answered = answered + 1
   by_status[status] = (by_status[status] or 0) + 1
   if status >= 500 and not (mode == "drain" and status == 503) then
      server_errors = server_errors + 1
   end
   local good = k and k.check(status, body)
   if not good and mode == "drain" and status == 503 then
      good = error_code(body) == "shutting_down"
   end
   if good then
      right = right + 1
   else
      wrong = wrong + 1
      if first_wrong == "" then
         first_wrong = (k and k.name or "?") .. " -> " .. status .. " " .. body:sub(1, 160)
      end
   end
   local parts = {}
   for s, n in pairs(by_status) do parts[#parts + 1] = s .. ":" .. n end
   table.sort(parts)
   statuses = table.concat(parts, ",")
end

function done(summary, latency, reqs)
   local t = {requests = 0, answered = 0, right = 0, wrong = 0, unanswered = 0,
              server_errors = 0}
   local merged, example, lost = {}, "", ""
   for _, thread in ipairs(_G.threads) do
      for key in pairs(t) do
         t[key] = t[key] + (thread:get(key) or 0)
      end
      -- In drain mode the server is gone when wrk stops: a request still
      -- waiting then was never answered.
      if thread:get("mode") == "drain" then
         t.unanswered = t.unanswered + (thread:get("pending_now") or 0)
      end
      for s, n in (thread:get("statuses") or ""):gmatch("(%d+):(%d+)") do
         merged[s] = (merged[s] or 0) + tonumber(n)
      end
      if example == "" then example = thread:get("first_wrong") or "" end
      if lost == "" then lost = thread:get("first_unanswered") or "" end
   end
   local parts = {}
   for s, n in pairs(merged) do parts[#parts + 1] = s .. ":" .. n end
   table.sort(parts)
   io.write(string.format("mix: requests=%d answered=%d right=%d wrong=%d unanswered=%d " ..
                          "5xx=%d statuses=%s\n", t.requests, t.answered, t.right, t.wrong,
                          t.unanswered, t.server_errors, table.concat(parts, ",")))
   if lost ~= "" then
      io.write("mix: first unanswered request: " .. lost .. "\n")
   end
   if example ~= "" then
      io.write("mix: first wrong answer: " .. example:gsub("\n", " ") .. "\n")
   end
end
