-- wrk script: POST a 1 KiB body with one of KEYED_CYCLE (default 1000)
-- keys in turn, "c-<KEYED_PREFIX>-<n>": once each has been sent (a warm-up
-- run), every request is a replay, of keys spread over the store (on Citus,
-- over every worker) rather than of one key. Used by tests/bench/citus.py.
wrk.method = "POST"
wrk.body = string.rep("x", 1024)
wrk.headers["Content-Type"] = "application/octet-stream"

local n = tonumber(os.getenv("KEYED_CYCLE") or "1000")
local prefix = os.getenv("KEYED_PREFIX") or "bench"
local counter = 0

function request()
	counter = counter + 1
	wrk.headers["Idempotency-Key"] = "c-" .. prefix .. "-" .. (counter % n)
	return wrk.format()
end
