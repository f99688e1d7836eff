'use strict';
// What a user would write instead of the gate: a Stripe webhook endpoint in
// plain Node.js that verifies the signature with the `stripe` package and
// drops duplicates with a Redis `SET NX EX`, the idempotency recipe most
// guides give. It acts on nothing (no app behind it): the bench's node rows
// measure the verify-and-dedupe part alone, next to the gate that does the
// same and forwards.
//
// Environment (set by `hookgate-bench suite`):
//   PORT                   where to listen (127.0.0.1)
//   REDIS_URL              redis://127.0.0.1:PORT/0
//   STRIPE_WEBHOOK_SECRET  the endpoint's signing secret (the gate's)
//   KEY_PREFIX             keys are `${KEY_PREFIX}:${event.id}`

const http = require('node:http');
const Stripe = require('stripe');
const { createClient } = require('redis');

const PATH = '/webhooks/stripe';
// Four days, the gate's default `store.retention`.
const RETENTION_SECONDS = 345600;
// The bench signs its events before the run starts: the gate's rows use a
// one-hour window (`tolerance = "1h"`), and so does this handler.
const TOLERANCE_SECONDS = 3600;

const secret = process.env.STRIPE_WEBHOOK_SECRET;
const prefix = process.env.KEY_PREFIX || 'webhooks';
// constructEvent makes no API call: the API key is never used.
const stripe = new Stripe('sk_test_unused');
// One client for the whole process, created at start.
const redis = createClient({ url: process.env.REDIS_URL });
redis.on('error', (err) => console.error('redis:', err.message));

// `Hookgate-Result` is not what a user would send: the load generator checks
// it on every answer, as it does the gate's, so that a duplicate row is known
// to have measured duplicates.
function answer(res, status, result, body) {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'Content-Length': Buffer.byteLength(text),
    'Hookgate-Result': result,
  });
  res.end(text);
}

async function handle(req, res, rawBody) {
  let event;
  try {
    event = stripe.webhooks.constructEvent(
      rawBody,
      req.headers['stripe-signature'],
      secret,
      TOLERANCE_SECONDS,
    );
  } catch (err) {
    answer(res, 400, 'invalid_signature', { error: 'invalid signature' });
    return;
  }
  let claimed;
  try {
    claimed = await redis.set(`${prefix}:${event.id}`, '1', {
      condition: 'NX',
      expiration: { type: 'EX', value: RETENTION_SECONDS },
    });
  } catch (err) {
    // Stripe retries a non-2xx answer: nothing is lost.
    answer(res, 503, 'store_unavailable', { error: 'store unavailable' });
    return;
  }
  if (claimed === null) {
    answer(res, 200, 'duplicate', { received: true });
    return;
  }
  // The event's work would go here.
  answer(res, 200, 'processed', { received: true });
}

const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/healthz') {
    answer(res, 200, 'ok', { ok: redis.isReady });
    return;
  }
  if (req.method !== 'POST' || req.url !== PATH) {
    answer(res, 404, 'unknown_route', { error: 'not found' });
    return;
  }
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    handle(req, res, Buffer.concat(chunks)).catch((err) => {
      console.error(err);
      answer(res, 500, 'internal_error', { error: 'internal error' });
    });
  });
});

redis
  .connect()
  .then(() => {
    server.listen(Number(process.env.PORT), '127.0.0.1', () => {
      console.error(`listening on 127.0.0.1:${process.env.PORT}`);
    });
  })
  .catch((err) => {
    console.error('cannot connect to redis:', err.message);
    process.exit(1);
  });

process.on('SIGTERM', () => {
  server.close(() => redis.quit().finally(() => process.exit(0)));
  server.closeIdleConnections();
});
