// The worker metrics (prom-client): the Python worker's names and labels, read at scrape time.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { WorkerMetrics } from '../src/metrics.js';
import { Poller, monotonic } from '../src/poller.js';
import { appendKeys, ownersKey, runScript } from '../src/scripts.js';
import { deleteKeys, prefix, connectRedis } from './helpers.js';

/** @type {any} */
let redis = null;
const p = prefix();
const keys = [0, 1].map((i) => `${p}m:{m:${i}}`);
const layout = { shards: keys.map((key, index) => ({ index, key, state: 'ACTIVE' })) };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

before(async () => {
  redis = await connectRedis();
  if (!redis) return;
  for (const key of keys) {
    await redis.xgroup('CREATE', key, 'g', '0', 'MKSTREAM');
    await redis.hset(ownersKey(key), 'g', JSON.stringify({ memberId: 'm1', incarnation: 'i1', memberEpoch: 1 }));
  }
});
after(async () => {
  if (redis) {
    await deleteKeys(redis, p);
    redis.disconnect();
  }
});

test('handled, failed, retried, owned shards, per-shard lag and pending, the handler histogram; served on /metrics', async (t) => {
  const metrics = new WorkerMetrics({ defaultMetrics: false });
  let calls = 0;
  const poller = new Poller({
    redis, group: 'g', memberId: 'm1', incarnation: 'i1', concurrency: 2, log: () => {}, stream: 'orders', metrics,
    settings: { reclaimEveryMs: 100, retryAfterMs: 10 },
    handler: () => { calls += 1; if (calls === 1) throw new Error('the first call fails'); },
  });
  poller.measureLag = true;
  const worker = {
    options: { stream: 'orders', group: 'g' }, memberId: 'm1', poller,
    member: { machine: { owned: new Set([0, 1]) } },
  };
  metrics.track(/** @type {any} */ (worker));
  const server = await metrics.serve(0, '127.0.0.1');
  try {
    poller.renewed(monotonic() + 60);
    poller.assigned([0, 1], layout);
    for (const mid of ['a', 'b', 'c']) await runScript(redis, 'append', appendKeys(keys[0], 'x'), ['', 0, 0, 0, 1, 2, 'mid', mid]);
    const end = Date.now() + 3000;
    while (poller.handled < 3 && Date.now() < end) await sleep(10);
    await sleep(300); // a measuring round
    const port = /** @type {any} */ (server.address()).port;
    const answer = await fetch(`http://127.0.0.1:${port}/metrics`);
    assert.equal(answer.status, 200);
    const text = await answer.text();
    const labels = 'stream="orders",group="g",member="m1"';
    assert.match(text, new RegExp(`rsc_worker_handled_total\\{${labels}\\} 3`));
    assert.match(text, new RegExp(`rsc_worker_failed_total\\{${labels}\\} 1`));
    assert.match(text, new RegExp(`rsc_worker_retried_total\\{${labels}\\} 1`));
    assert.match(text, new RegExp(`rsc_worker_dead_lettered_total\\{${labels}\\} 0`));
    assert.match(text, new RegExp(`rsc_worker_owned_shards\\{${labels}\\} 2`));
    assert.match(text, new RegExp(`rsc_worker_shard_lag\\{${labels},shard="0"\\} 0`));
    assert.match(text, new RegExp(`rsc_worker_shard_pending\\{${labels},shard="0"\\} 0`));
    assert.match(text, /rsc_worker_handler_seconds_count\{stream="orders",group="g"\} 4/);
    assert.equal((await fetch(`http://127.0.0.1:${port}/other`)).status, 404);
  } finally {
    server.close();
    await poller.close();
  }
});
