// The Node.js worker bench/latency.py runs (the `rsc-node` contender): one member of
// RSC_BENCH_GROUP on RSC_BENCH_STREAM, handler records publish -> handler latency. Each message
// carries `ts` (the publisher's time.monotonic(): CLOCK_MONOTONIC, the same clock as
// process.hrtime here) and `phase`; the lines `phase latency_ms` go to RSC_BENCH_OUT when the
// worker leaves (SIGTERM).
import { writeFileSync } from 'node:fs';
import { createWorker } from '../clients/node/src/index.js';

const env = process.env;
/** @type {string[]} */
const records = [];
const worker = createWorker({
  coordinatorUrl: env.RSC_BENCH_COORDINATOR ?? 'http://127.0.0.1:8080',
  redisUrl: env.RSC_REDIS_URL,
  stream: env.RSC_BENCH_STREAM ?? 'bench',
  group: env.RSC_BENCH_GROUP ?? 'bench',
  memberId: `bench-node-${process.pid}`,
  handler: (message) => {
    const now = Number(process.hrtime.bigint()) / 1e9;
    records.push(`${message.fields.phase} ${((now - Number(message.fields.ts)) * 1000).toFixed(4)}\n`);
  },
  log: (line) => process.stderr.write(line + '\n'),
});
await worker.start();
process.on('SIGTERM', async () => {
  await worker.stop();
  writeFileSync(env.RSC_BENCH_OUT ?? '/dev/null', records.join(''));
  process.exit(0);
});
