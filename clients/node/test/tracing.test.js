// OpenTelemetry with the SDK's in-memory exporter: a message published inside a span is handled
// in a `process` span of the same trace (a child of the producer's `send` span) with the
// messaging attributes, through a retry and a dead-lettering; the handler never sees the trace
// fields. The Python coordinator (../../.venv/bin/rsc serve); skipped without it or Redis.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
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

test('publish to handler in one trace, through a retry and a dead letter', { timeout: 60_000 }, async (t) => {
  assert.ok(existsSync(RSC), `${RSC} is missing: run 'make setup' at the repository root first`);
  const redis = await connectRedis();
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider();
  provider.addSpanProcessor(new SimpleSpanProcessor(exporter));
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(provider);
  const keyPrefix = prefix();
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const coordinator = spawn(RSC, ['serve', '--bind', `127.0.0.1:${port}`, '--redis-url', REDIS_URL, '--key-prefix', keyPrefix], {
    cwd: root,
    env: { ...process.env, RSC_HEARTBEAT_INTERVAL_MS: '200', RSC_MEMBER_LEASE_TTL_MS: '2000', RSC_LOG_LEVEL: 'warning' },
    stdio: ['ignore', 'ignore', 'ignore'],
  });
  /** @type {any} */
  let worker;
  /** @type {any} */
  let producer;
  try {
    for (let i = 0; ; i++) {
      try { if ((await fetch(`${url}/v1/version`)).ok) break; } catch { /* starting */ }
      if (i > 200) throw new Error('no coordinator');
      await sleep(100);
    }
    /** @type {Record<string, string>[]} */
    const seen = [];
    worker = await createWorker({
      coordinatorUrl: url, redisUrl: REDIS_URL, stream: 'traced', group: 'g', memberId: 'w1', concurrency: 1,
      poller: { retryAfterMs: 50, maxDeliveries: 2 }, log: () => {},
      handler: async (message) => {
        seen.push({ ...message.fields });
        if (message.fields.n === 'bad') throw new Error('poison');
      },
    }).start();
    producer = createProducer({ coordinatorUrl: url, redisUrl: REDIS_URL, stream: 'traced', log: () => {} });
    const tracer = trace.getTracer('test');
    let requestTrace = '';
    await tracer.startActiveSpan('request', async (request) => {
      requestTrace = request.spanContext().traceId;
      await producer.publish('k1', { n: 'good' });
      await producer.publish('k2', { n: 'bad' });
      request.end();
    });
    for (let i = 0; !exporter.getFinishedSpans().some((s) => s.name === 'settle traced'); i++) {
      if (i > 300) throw new Error('no settle span');
      await sleep(50);
    }
    const spans = exporter.getFinishedSpans();
    const sends = spans.filter((s) => s.name === 'send traced');
    assert.equal(sends.length, 2);
    assert.ok(sends.every((s) => s.spanContext().traceId === requestTrace));
    const processes = spans.filter((s) => s.name === 'process traced');
    assert.equal(processes.length, 3); // good once, bad twice, then dead-lettered
    const sendIds = new Set(sends.map((s) => s.spanContext().spanId));
    for (const span of processes) {
      assert.equal(span.spanContext().traceId, requestTrace);
      assert.ok(sendIds.has(span.parentSpanId ?? span.parentSpanContext?.spanId));
      assert.equal(span.attributes['messaging.system'], 'rsc');
      assert.equal(span.attributes['messaging.consumer.group.name'], 'g');
      assert.equal(span.attributes['messaging.destination.name'], 'traced');
    }
    const failed = processes.filter((s) => s.status.code === 2);
    assert.deepEqual(failed.map((s) => s.attributes['messaging.rsc.message.delivery_count']).sort(), [1, 2]);
    const settle = spans.find((s) => s.name === 'settle traced');
    assert.equal(settle?.attributes['messaging.rsc.settle'], 'dead_letter');
    assert.ok(seen.every((fields) => !Object.keys(fields).some((k) => k.startsWith('rsc:'))));
  } finally {
    await worker?.stop();
    await producer?.close();
    coordinator.kill('SIGTERM');
    await new Promise((r) => { const k = setTimeout(() => { coordinator.kill('SIGKILL'); r(undefined); }, 5000); coordinator.on('exit', () => { clearTimeout(k); r(undefined); }); });
    await deleteKeys(redis, keyPrefix);
    redis.disconnect();
    trace.disable();
    context.disable();
  }
});

test('without a tracer provider registered, entries carry no trace fields', async () => {
  const { sendSpan } = await import('../src/tracing.js');
  await sendSpan('s', 1, async (carried) => { assert.deepEqual(carried, {}); return []; });
});
