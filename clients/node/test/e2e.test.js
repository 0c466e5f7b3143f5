// End to end: the Python coordinator (../../.venv/bin/rsc serve), two Node workers (the second
// joins under load: a revoke handoff) and a Node producer. Every message is handled; no two
// handler calls on one shard ever overlap. Skipped without the coordinator or Redis.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createProducer, createWorker } from '../src/index.js';
import { REDIS_URL, deleteKeys, prefix, connectRedis } from './helpers.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const RSC = join(root, '.venv', 'bin', 'rsc');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = /** @type {any} */ (server.address());
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

async function until(check, timeoutMs, what) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await check()) return;
    await sleep(100);
  }
  throw new Error(`timed out waiting for ${what}`);
}

test('coordinator + two workers + producer: every message handled, never twice at once on a shard', { timeout: 60_000 }, async (t) => {
  assert.ok(existsSync(RSC), `${RSC} is missing: run 'make setup' at the repository root first`);
  const redis = await connectRedis();
  const keyPrefix = prefix();
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  let logs = '';
  const coordinator = spawn(RSC, ['serve', '--bind', `127.0.0.1:${port}`, '--redis-url', REDIS_URL, '--key-prefix', keyPrefix], {
    cwd: root,
    env: { ...process.env, RSC_HEARTBEAT_INTERVAL_MS: '200', RSC_MEMBER_LEASE_TTL_MS: '2000', RSC_LOG_LEVEL: 'warning' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  coordinator.stdout.on('data', (d) => { logs += d; });
  coordinator.stderr.on('data', (d) => { logs += d; });
  /** @type {any[]} */
  const workers = [];
  let producer;
  try {
    await until(async () => {
      try { return (await fetch(`${url}/v1/version`)).ok; } catch { return false; }
    }, 20_000, 'the coordinator');

    /** per shard key: calls in flight; and every overlap seen */
    const inFlight = new Map();
    const overlaps = [];
    const handled = new Map();
    const handler = (name) => async (message) => {
      const n = (inFlight.get(message.key) ?? 0) + 1;
      inFlight.set(message.key, n);
      if (n > 1) overlaps.push(`${name} ${message.key} ${message.id}`);
      try {
        await sleep(2);
      } finally {
        inFlight.set(message.key, inFlight.get(message.key) - 1);
      }
      handled.set(message.fields.mid, (handled.get(message.fields.mid) ?? 0) + 1);
    };
    const quiet = () => {};
    const worker = (name) => createWorker({
      coordinatorUrl: url, redisUrl: REDIS_URL, stream: 'orders', group: 'billing', memberId: name,
      concurrency: 4, handler: handler(name), log: quiet,
    });
    workers.push(await worker('w1').start());
    producer = createProducer({ coordinatorUrl: url, redisUrl: REDIS_URL, stream: 'orders', log: quiet });
    const batch = (from, n) => Array.from({ length: n }, (_, i) => ({
      key: `k${(from + i) % 13}`, fields: { mid: `m${from + i}`, bkey: `k${(from + i) % 13}`, seq: String(from + i) },
    }));
    const ids = await producer.publishMany(batch(0, 150));
    assert.equal(ids.length, 150);
    await sleep(300);
    workers.push(await worker('w2').start()); // a handoff under load: revokes, then installs
    for (let i = 150; i < 300; i += 30) {
      await producer.publishMany(batch(i, 30));
      await sleep(50);
    }
    await until(() => handled.size === 300, 30_000, `all 300 handled (${handled.size} so far)`);
    await sleep(500);
    assert.deepEqual(overlaps, []);
    const owned = workers.map((w) => w.member.machine.owned.size);
    assert.equal(owned.reduce((a, b) => a + b, 0), 4, `4 shards between the two: ${owned}`);
    assert.ok(owned.every((n) => n === 2), `balanced: ${owned}`);
    // Nothing left pending once both leave.
    await Promise.all(workers.map((w) => w.stop()));
    workers.length = 0;
    const keys = (await redis.keys(`${keyPrefix}orders:*`)).filter((k) => !k.includes(':rsc:') && !k.endsWith(':dlq'));
    let pending = 0;
    for (const key of keys) {
      if ((await redis.type(key)) !== 'stream') continue;
      pending += Number((await redis.xpending(key, 'billing'))[0]);
    }
    assert.equal(pending, 0);
  } catch (err) {
    t.diagnostic(logs.slice(-3000));
    throw err;
  } finally {
    await Promise.allSettled(workers.map((w) => w.stop()));
    await producer?.close();
    coordinator.kill('SIGTERM');
    await new Promise((r) => { const k = setTimeout(() => { coordinator.kill('SIGKILL'); r(); }, 5000); coordinator.on('exit', () => { clearTimeout(k); r(); }); });
    await deleteKeys(redis, keyPrefix);
    redis.disconnect();
  }
});
