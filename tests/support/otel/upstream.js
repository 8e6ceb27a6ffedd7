// upstream.js - an upstream for the trace tests: a plain node http server
// instrumented with the OpenTelemetry SDK for Node (the versions pinned in
// package-lock.json here), exporting its spans over OTLP/HTTP (JSON) to the
// receiver of the test (tests/integration/support/otlp.py).
//
//   node upstream.js PORT [MODULES]
//
// Listens on 127.0.0.1:PORT (0: an ephemeral port) and prints "PORT <n>" as
// the first line on stdout once listening. MODULES is the directory holding
// node_modules/ (npm ci of package.json here; default: this directory).
//
// Environment:
//   OTEL_EXPORTER_OTLP_TRACES_ENDPOINT  the URL the spans are POSTed to
//                     (http://127.0.0.1:P/v1/traces); unset: no export
//   OTEL_SERVICE_NAME the resource's service.name (default orders-upstream)
//
// Every request gets one SERVER span, "METHOD path" (no query), the child of
// the W3C trace context (traceparent, tracestate) extracted from its headers
// - a root span when there is none. A SimpleSpanProcessor exports each span
// as it ends, so it reaches the receiver about when the answer does.
//
// Answers (all JSON but /healthz; any method may add ?sleep_ms=N, which
// delays the answer N ms once the body has been read):
//   POST/PUT/PATCH/DELETE <path>  counts one execution for its
//                     Idempotency-Key header (in memory) and answers 201
//                     {"order": <that key's count>, "key": <key or null>,
//                      "traceparent": <as received or null>,
//                      "x_request_id": <X-Request-Id as received or null>,
//                      "trace_id", "span_id": <this server's span>}
//   <any method> /fail  the same execution, counted, but answered 500
//   GET /count?key=K  {"count": <K's executions>}
//   GET /healthz      200 "ok"
//   GET <other path>  200 {"method", "path", "traceparent", "x_request_id",
//                     "trace_id", "span_id"}
//
// On SIGTERM: stops listening, force-flushes the tracer provider (spans not
// yet exported are sent) and exits 0; an export that has not finished in
// FLUSH_LIMIT_MS is given up (reported on stderr), the exit is still 0.
'use strict';

const http = require('http');
const path = require('path');

const FLUSH_LIMIT_MS = 5000;

const [portArg, modulesArg] = process.argv.slice(2);
const modules = path.resolve(modulesArg || __dirname);

function load(name) {
	return require(require.resolve(name, { paths: [modules] }));
}

const api = load('@opentelemetry/api');
const { W3CTraceContextPropagator } = load('@opentelemetry/core');
const { resourceFromAttributes } = load('@opentelemetry/resources');
const { NodeTracerProvider, SimpleSpanProcessor } =
	load('@opentelemetry/sdk-trace-node');
const { OTLPTraceExporter } = load('@opentelemetry/exporter-trace-otlp-http');
const semconv = load('@opentelemetry/semantic-conventions');

// The SDK reports failed exports through diag, silent unless given a logger:
// to stderr (which the tests capture), never stdout (the PORT line).
api.diag.setLogger(new api.DiagConsoleLogger(), api.DiagLogLevel.WARN);

const serviceName = process.env.OTEL_SERVICE_NAME || 'orders-upstream';
const endpoint = process.env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
const spanProcessors = [];
if (endpoint) {
	spanProcessors.push(new SimpleSpanProcessor(
		new OTLPTraceExporter({ url: endpoint })));
} else {
	console.error('upstream.js: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT unset, ' +
		'spans are not exported');
}
const provider = new NodeTracerProvider({
	resource: resourceFromAttributes({
		[semconv.ATTR_SERVICE_NAME]: serviceName,
	}),
	spanProcessors,
});
const tracer = provider.getTracer('idemproxy-tests-upstream');
const propagator = new W3CTraceContextPropagator();

const MUTATIONS = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
const executions = new Map();	// Idempotency-Key -> count

// One request: its body read, answered (after ?sleep_ms=), its span ended.
function handle(req, res) {
	const url = new URL(req.url, 'http://upstream.invalid');
	const parent = propagator.extract(api.ROOT_CONTEXT, req.headers,
		api.defaultTextMapGetter);
	const attributes = {
		[semconv.ATTR_HTTP_REQUEST_METHOD]: req.method,
		[semconv.ATTR_URL_PATH]: url.pathname,
	};
	if (url.search) {
		attributes[semconv.ATTR_URL_QUERY] = url.search.slice(1);
	}
	const span = tracer.startSpan(`${req.method} ${url.pathname}`,
		{ kind: api.SpanKind.SERVER, attributes }, parent);
	const ids = span.spanContext();
	const seen = {
		traceparent: req.headers.traceparent ?? null,
		x_request_id: req.headers['x-request-id'] ?? null,
		trace_id: ids.traceId,
		span_id: ids.spanId,
	};

	req.resume();	// the body is read, not kept
	req.on('end', () => {
		const [status, type, body] = answer(req, url, seen);
		const sleep = Number(url.searchParams.get('sleep_ms') || 0);
		setTimeout(() => {
			span.setAttribute(semconv.ATTR_HTTP_RESPONSE_STATUS_CODE, status);
			if (status >= 500) {
				span.setStatus({ code: api.SpanStatusCode.ERROR });
			}
			res.writeHead(status, {
				'Content-Type': type,
				'Content-Length': Buffer.byteLength(body),
			});
			res.end(body);
			span.end();
		}, sleep);
	});
	req.on('error', (err) => {
		span.recordException(err);
		span.setStatus({ code: api.SpanStatusCode.ERROR });
		span.end();
	});
}

// [status, content type, body] for a request (module comment).
function answer(req, url, seen) {
	const json = (status, value) =>
		[status, 'application/json', JSON.stringify(value)];
	if (MUTATIONS.has(req.method) || url.pathname === '/fail') {
		const key = req.headers['idempotency-key'] ?? null;
		const n = (executions.get(key ?? '') || 0) + 1;
		executions.set(key ?? '', n);
		const value = { order: n, key, ...seen };
		return json(url.pathname === '/fail' ? 500 : 201, value);
	}
	if (url.pathname === '/count') {
		const key = url.searchParams.get('key') ?? '';
		return json(200, { count: executions.get(key) || 0 });
	}
	if (url.pathname === '/healthz') {
		return [200, 'text/plain', 'ok\n'];
	}
	return json(200, { method: req.method, path: url.pathname, ...seen });
}

const server = http.createServer(handle);
server.listen(Number(portArg || 0), '127.0.0.1', () => {
	process.stdout.write(`PORT ${server.address().port}\n`);
});

process.on('SIGTERM', () => {
	server.close();
	server.closeIdleConnections();
	const limit = setTimeout(() => {
		console.error(`upstream.js: spans not flushed in ${FLUSH_LIMIT_MS} ms`);
		process.exit(0);
	}, FLUSH_LIMIT_MS);
	provider.forceFlush()
		.then(() => provider.shutdown())
		.catch((err) => console.error(`upstream.js: flush: ${err}`))
		.finally(() => {
			clearTimeout(limit);
			process.exit(0);
		});
});
