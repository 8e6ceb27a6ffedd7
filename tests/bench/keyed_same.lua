-- wrk script: POST a 1 KiB body, every request with the same
-- Idempotency-Key (KEYED_KEY, default "bench-same-key"): the first request
-- wins, every later one is a replay of the stored response (no upstream
-- hop). The request is built once, like tests/bench/post1k.lua, so wrk's
-- own cost is the same as for the pass-through rows.
-- Used by tests/bench/keyed.sh.
wrk.method = "POST"
wrk.body = string.rep("x", 1024)
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers[os.getenv("KEYED_HEADER") or "Idempotency-Key"] =
	os.getenv("KEYED_KEY") or "bench-same-key"
