// sdk_errors.js - one scenario of tests/integration/test_sdk_errors.py with a
// real SDK (stripe-node or openai) pointed at idemproxy, and the same request
// sent raw, so that the test can hold what the SDK made of an answer against
// the answer itself.
//
//   node sdk_errors.js MODULES SDK SCENARIO PROXY_PORT STUB_PORT KEY
//
// MODULES is the directory holding node_modules/ (npm ci of package.json
// here); SDK is "stripe" or "openai". Scenarios:
//
//   in-progress  a raw request with KEY whose upstream answer takes
//                DELAY_MS (the stub's ?delay_ms=, which the proxy's
//                --fingerprint-query ignore leaves out of the fingerprint);
//                once the stub has seen it, the SDK sends the same request
//                (409), then a raw duplicate does; then the first ends
//   mismatch     the SDK sends request 1 (executed), then request 2 under
//                the same key (422), then request 2 raw
//   store-down   the SDK sends request 1 (a proxy whose store is down: 503),
//                then the same raw
//   unknown      a raw request with KEY that the upstream executes and then
//                drops (?drop=1, out of the fingerprint as above): 502
//                outcome-unknown; then the SDK sends the same request (the
//                replayed 502), then a raw duplicate does
//
// Prints one JSON line: {"sdk": <what the SDK's last call gave>, "raw":
// {"status", "body"}, "first": <the in-progress first request's status, or
// the mismatch's first SDK result>}. An SDK result is {"ok": true, "value"}
// or {"ok": false, "class", "type", "rawType", "code", "status", "message"}.
'use strict';

const http = require('http');
const path = require('path');

const DELAY_MS = 2000;

const [modules, sdkName, scenario, proxyPortArg, stubPortArg, key] =
	process.argv.slice(2);
const proxyPort = Number(proxyPortArg);
const stubPort = Number(stubPortArg);

function load(name) {
	return require(require.resolve(name, { paths: [path.resolve(modules)] }));
}

// Request n of each SDK: the params, and the bytes the SDK sends for them.
const SDKS = {
	stripe: {
		path: '/v1/payment_intents',
		type: 'application/x-www-form-urlencoded',
		params: (n) => ({ amount: 1000 * n, currency: 'usd' }),
		body: (n) => `amount=${1000 * n}&currency=usd`,
		client() {
			const Stripe = load('stripe');
			const stripe = new Stripe('sk_test_x', {
				host: '127.0.0.1', port: proxyPort, protocol: 'http',
				maxNetworkRetries: 0,
			});
			return (n) => stripe.paymentIntents.create(this.params(n),
				{ idempotencyKey: key });
		},
	},
	openai: {
		path: '/v1/chat/completions',
		type: 'application/json',
		params: (n) => ({
			model: 'gpt-4o-mini',
			messages: [{ role: 'user', content: `order ${n}` }],
		}),
		body(n) { return JSON.stringify(this.params(n)); },
		client() {
			const { OpenAI } = load('openai');
			const client = new OpenAI({
				apiKey: 'sk-test', baseURL: `http://127.0.0.1:${proxyPort}/v1`,
				maxRetries: 0,
			});
			return (n) => client.chat.completions.create(this.params(n),
				{ headers: { 'Idempotency-Key': key } });
		},
	},
};

// One HTTP/1.1 request on its own connection: {status, body}.
function request(port, method, target, headers, body) {
	return new Promise((resolve, reject) => {
		const req = http.request({
			host: '127.0.0.1', port, method, path: target, agent: false,
			headers: body === undefined ? headers : {
				...headers, 'Content-Length': Buffer.byteLength(body),
			},
		}, (res) => {
			const chunks = [];
			res.on('data', (c) => chunks.push(c));
			res.on('end', () => resolve({
				status: res.statusCode,
				body: Buffer.concat(chunks).toString('utf8'),
			}));
			res.on('error', reject);
		});
		req.on('error', reject);
		req.end(body);
	});
}

function raw(sdk, n, query) {
	return request(proxyPort, 'POST', sdk.path + (query || ''), {
		'Content-Type': sdk.type, 'Idempotency-Key': key,
	}, sdk.body(n));
}

// Until the stub has counted a request with the key (it counts one as soon
// as it has read it, before any delay_ms).
async function seenUpstream() {
	for (let i = 0; i < 1000; i++) {
		const st = await request(stubPort, 'GET', '/__stats', {});
		if ((JSON.parse(st.body).keys[key] || 0) >= 1)
			return;
		await new Promise((r) => setTimeout(r, 10));
	}
	throw new Error(`the upstream never saw ${key}`);
}

async function outcome(promise) {
	try {
		return { ok: true, value: await promise };
	} catch (err) {
		if (!(err instanceof Error) || (err.status === undefined &&
		    err.statusCode === undefined))
			throw err;	// not an answer: a bug of this script
		return {
			ok: false,
			class: err.constructor.name,
			type: err.type,
			rawType: err.rawType,
			code: err.code,
			status: err.statusCode !== undefined ? err.statusCode
				: err.status,
			message: err.message,
		};
	}
}

async function main() {
	const sdk = SDKS[sdkName];
	const call = sdk.client();
	const out = {};

	switch (scenario) {
	case 'in-progress': {
		const first = raw(sdk, 1, `?delay_ms=${DELAY_MS}`);
		await seenUpstream();
		out.sdk = await outcome(call(1));
		out.raw = await raw(sdk, 1);
		out.first = (await first).status;
		break;
	}
	case 'mismatch':
		out.first = await outcome(call(1));
		out.sdk = await outcome(call(2));
		out.raw = await raw(sdk, 2);
		break;
	case 'store-down':
		out.sdk = await outcome(call(1));
		out.raw = await raw(sdk, 1);
		break;
	case 'unknown':
		out.first = (await raw(sdk, 1, '?drop=1')).status;
		out.sdk = await outcome(call(1));
		out.raw = await raw(sdk, 1);
		break;
	default:
		throw new Error(`unknown scenario ${scenario}`);
	}
	process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((err) => {
	process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
	process.exit(1);
});
