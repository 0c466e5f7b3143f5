#!/usr/bin/env node
// The Node.js client under the conformance contract (docs/clients.md): one JSON line on stdout
// when each handler call starts and ends (or is aborted), logs on stderr; SIGTERM leaves
// gracefully and exits 0; a refused credential (401/403) exits 2 with one line on stderr.
// With RSC_ROLE=producer it publishes instead: RSC_PUBLISH_COUNT messages in calls of
// RSC_PUBLISH_BATCH, one "ack" (or "fail") line per message, then exits 0.
import { writeSync } from 'node:fs';
import {
  Coordinator, CoordinatorAuthError, CoordinatorRejected, MemberReplaced, Producer, connectRedis, createWorker,
} from '../src/index.js';

const env = process.env;
const handlerMs = Number(env.RSC_HANDLER_MS || 0);
const concurrency = env.RSC_CONCURRENCY ? Number(env.RSC_CONCURRENCY) : undefined;
const isStatic = env.RSC_STATIC === '1';
const memberId = env.RSC_MEMBER_ID || `node-conformance-${process.pid}`;
const verbose = (env.RSC_LOG_LEVEL || '').toLowerCase() === 'debug';
const log = (/** @type {string} */ line) => { process.stderr.write(`rsc-node ${process.pid}: ${line}\n`); };

/** @param {string} ev @param {any} m */
function record(ev, m) {
  const line = JSON.stringify({
    ev, pid: process.pid, member: m.memberId, shard: m.shard, key: m.key, id: m.id,
    t: Number(process.hrtime.bigint()) / 1e9,
    mid: m.fields.mid ?? null, bkey: m.fields.bkey ?? null, seq: m.fields.seq ?? null, deliveries: m.deliveries,
  });
  writeSync(1, line + '\n'); // one system call per line
}

/** @param {number} ms @param {AbortSignal} signal */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) { reject(signal.reason); return; }
    const timer = setTimeout(() => { signal.removeEventListener('abort', onAbort); resolve(undefined); }, ms);
    const onAbort = () => { clearTimeout(timer); reject(signal.reason); };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

if (env.RSC_ROLE === 'producer') {
  const producerId = env.RSC_PRODUCER_ID || `node-conformance-producer-${process.pid}`;
  const count = Number(env.RSC_PUBLISH_COUNT || 200);
  const batch = Number(env.RSC_PUBLISH_BATCH || 1);
  const intervalMs = Number(env.RSC_PUBLISH_INTERVAL_MS || 0);
  const coordinator = new Coordinator({ urls: env.RSC_COORDINATOR_URL || 'http://127.0.0.1:8080', token: env.RSC_TOKEN || undefined });
  const redis = await connectRedis(env.RSC_REDIS_URL || 'redis://127.0.0.1:6379');
  const producer = new Producer({ coordinator, redis, stream: env.RSC_STREAM || 'conformance', producerId, log });
  try {
    await producer.start();
  } catch (err) {
    process.stderr.write(`rsc-node: the coordinator refused the producer: ${err instanceof Error ? err.message : err}\n`);
    process.exit(2);
  }
  for (let start = 1; start <= count; start += batch) {
    const messages = [];
    for (let n = start; n < Math.min(start + batch, count + 1); n++) {
      messages.push({ key: `k${n % 16}`, fields: { mid: `${producerId}-${n}`, bkey: `k${n % 16}`, seq: String(n) } });
    }
    /** @type {(string|null)[]} */
    let ids;
    let ev = 'ack';
    try {
      ids = await producer.publishMany(messages);
    } catch (err) {
      log(`publish failed: ${err instanceof Error ? err.message : err}`);
      ids = messages.map(() => null);
      ev = 'fail';
    }
    const t = Number(process.hrtime.bigint()) / 1e9;
    writeSync(1, messages.map((m, i) => JSON.stringify({ ev, mid: m.fields.mid, id: ids[i], t }) + '\n').join(''));
    if (intervalMs) await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
  await producer.close();
  redis.disconnect();
  process.exit(0);
}

const worker = createWorker({
  coordinatorUrl: env.RSC_COORDINATOR_URL || 'http://127.0.0.1:8080',
  redisUrl: env.RSC_REDIS_URL || 'redis://127.0.0.1:6379',
  stream: env.RSC_STREAM || 'conformance',
  group: env.RSC_GROUP || 'conformance',
  token: env.RSC_TOKEN || undefined,
  memberId,
  static: isStatic,
  concurrency,
  poller: { retryAfterMs: 500, reclaimEveryMs: 500 },
  log: verbose ? log : (line) => { if (!/^[^:]+: (reads|waits|revoking|lost) /.test(line) || verbose) log(line); },
  handler: async (message, { signal }) => {
    record('start', message);
    try {
      if (handlerMs > 0) await sleep(handlerMs, signal);
      if (signal.aborted) throw signal.reason;
    } catch (err) {
      record('abort', message);
      throw err;
    }
    record('end', message);
  },
});

let stopping = false;
const leave = () => {
  if (stopping) return;
  stopping = true;
  log('SIGTERM: leaving the group');
  worker.stop();
};
process.on('SIGTERM', leave);
process.on('SIGINT', leave);

try {
  await worker.start();
  await worker.done;
  log('left the group');
  process.exit(0);
} catch (err) {
  if (err instanceof CoordinatorAuthError) {
    process.stderr.write(`rsc-node: the coordinator refused the credential: ${err.message}\n`);
    process.exit(2);
  }
  if (err instanceof MemberReplaced) {
    log(err.message);
    process.exit(3);
  }
  if (err instanceof CoordinatorRejected) {
    log(`the coordinator refused this member: ${err.message}`);
    process.exit(1);
  }
  log(`failed: ${err instanceof Error ? err.stack : err}`);
  process.exit(1);
}
