// The Node.js contenders of bench/producer.py: `rsc` publishes the workload with the Node.js
// client's producer (publishMany: jump-v1 routing, idempotent append.lua calls per shard),
// `raw` pipelines XADD round robin to the shard keys with ioredis. Prints the seconds the
// publishing took (the process's start and connections not counted).
// argv: rsc|raw <coordinator url> <redis url> <stream> <messages> <batch> <keys (comma-separated, raw)>
import { createProducer } from '../clients/node/src/index.js';
import { connectRedis } from '../clients/node/src/redis.js';

const [mode, coordinatorUrl, redisUrl, stream, count, batchSize, keyList] = process.argv.slice(2);
const BODY = 'x'.repeat(90);
const KEYS = 1000;
const total = Number(count);
const batch = Number(batchSize);
/** @type {{key: string, fields: Record<string, string>}[][]} */
const batches = [];
for (let n = 0; n < total; n += batch) {
  const chunk = [];
  for (let i = n; i < Math.min(n + batch, total); i++) chunk.push({ key: `customer-${i % KEYS}`, fields: { n: String(i), body: BODY } });
  batches.push(chunk);
}
const redis = await connectRedis(redisUrl);
let seconds;
if (mode === 'rsc') {
  const producer = createProducer({ coordinatorUrl, redis, stream, producerId: 'bench/node' });
  await producer.start();
  const start = process.hrtime.bigint();
  for (const chunk of batches) await producer.publishMany(chunk);
  seconds = Number(process.hrtime.bigint() - start) / 1e9;
  await producer.close();
} else {
  const keys = keyList.split(',');
  let n = 0;
  const start = process.hrtime.bigint();
  for (const chunk of batches) {
    const pipe = redis.pipeline();
    for (const m of chunk) pipe.xadd(keys[n++ % keys.length], '*', 'n', m.fields.n, 'body', m.fields.body);
    await pipe.exec();
  }
  seconds = Number(process.hrtime.bigint() - start) / 1e9;
}
redis.disconnect();
process.stdout.write(`${seconds}\n`);
