-- wrk script: POST a 1 KiB body (Content-Length) to the URL's path.
-- Used by tests/bench/passthrough.sh for the "POST 1 KiB" rows.
wrk.method = "POST"
wrk.body = string.rep("x", 1024)
wrk.headers["Content-Type"] = "application/octet-stream"
