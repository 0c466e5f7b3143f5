#!/usr/bin/env node
// Publish one message per partition key read as a JSON array on stdin, each with the fields
// {bkey: key, mid: key}, through this package's producer: what the mixed-fleet test compares
// with the Python router (tests/conformance/test_mixed_fleet.py). Environment as the
// conformance contract: RSC_COORDINATOR_URL, RSC_REDIS_URL, RSC_STREAM, RSC_TOKEN.
import { createProducer } from '../src/index.js';

let input = '';
for await (const chunk of process.stdin) input += chunk;
const keys = JSON.parse(input);
const producer = createProducer({
  coordinatorUrl: process.env.RSC_COORDINATOR_URL,
  redisUrl: process.env.RSC_REDIS_URL,
  stream: process.env.RSC_STREAM,
  token: process.env.RSC_TOKEN,
  log: (line) => process.stderr.write(`${line}\n`),
});
try {
  await producer.publishMany(keys.map((key) => ({ key, fields: { bkey: key, mid: key } })));
} finally {
  await producer.close();
}
