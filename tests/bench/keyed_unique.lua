-- wrk script: POST a 1 KiB body with a unique Idempotency-Key per request,
-- so that every request is a new key (claim + forward + capture + complete).
-- Used by tests/bench/keyed.sh.
--
-- Key: "u-<random prefix>-<thread>-<counter>". The prefix is 8 bytes of
-- /dev/urandom read once per thread, so keys never repeat across runs or
-- processes (a repeated key would be a replay, not a write).
--
-- KEYED_NOKEY=1 builds the very same requests without the key header: the
-- pass-through baseline with the same per-request Lua cost in wrk.
wrk.method = "POST"
wrk.body = string.rep("x", 1024)
wrk.headers["Content-Type"] = "application/octet-stream"

local nokey = os.getenv("KEYED_NOKEY") == "1"
local header = os.getenv("KEYED_HEADER") or "Idempotency-Key"
local nthreads = 0
local prefix
local counter = 0
local headers

function setup(thread)
	nthreads = nthreads + 1
	thread:set("tid", nthreads)
end

function init(args)
	local f = assert(io.open("/dev/urandom", "rb"))
	local raw = f:read(8)
	f:close()
	prefix = "u-" .. raw:gsub(".", function(c)
		return string.format("%02x", c:byte())
	end) .. "-" .. tostring(tid or 0) .. "-"
	headers = {}
	for k, v in pairs(wrk.headers) do headers[k] = v end
end

function request()
	counter = counter + 1
	if not nokey then
		headers[header] = prefix .. counter
	end
	return wrk.format(nil, nil, headers, nil)
end
