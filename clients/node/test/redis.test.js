// The data-plane scripts against a real Redis: appends, the seal, and the owner-token checks.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Coordinator } from '../src/coordinator.js';
import { Producer, ShardFull } from '../src/producer.js';
import { parseRedisUrl } from '../src/redis.js';
import { SCRIPTS, appendKeys, capKey, ownersKey, runScript, sealKey } from '../src/scripts.js';
import { deleteKeys, prefix, connectRedis } from './helpers.js';

/** @type {import('ioredis').Redis | null} */
let redis = null;
const p = prefix();
const shard = `${p}s:{s:0}`;
const owners = ownersKey(shard);
const group = 'g';

before(async () => {
  redis = await connectRedis();
  if (redis) {
    await redis.xgroup('CREATE', shard, group, '0', 'MKSTREAM');
    await redis.hset(owners, group, JSON.stringify({ memberId: 'm1', incarnation: 'i1', memberEpoch: 1 }));
  }
});
after(async () => {
  if (redis) {
    await deleteKeys(redis, p);
    redis.disconnect();
  }
});

test('redis URL forms', () => {
  assert.equal(parseRedisUrl('redis://h:7/2').db, 2);
  const s = parseRedisUrl('redis+sentinel://:pw@a:1,b:2/main/3?sentinel_password=x');
  assert.equal(s.kind, 'sentinel');
  assert.equal(s.service, 'main');
  assert.equal(s.db, 3);
  assert.equal(s.password, 'pw');
  assert.deepEqual(s.hosts, [{ host: 'a', port: 1 }, { host: 'b', port: 2 }]);
  assert.equal(parseRedisUrl('rediss://h').tls, true);
});

test('append, read and ack by the owner; refused for another incarnation', async (t) => {
  const ids = await runScript(redis, 'append', appendKeys(shard, 'p'), ['', 0, 0, 0, 2, 2, 'mid', 'a', 4, 'mid', 'b', 'x', 'y']);
  assert.equal(ids.length, 2);
  const [[refused, entries, tail]] = await runScript(redis, 'read', [shard, owners],
    [group, 'm1', 'i1', 'm1', 10, '0-0', '']);
  assert.equal(refused, '');
  assert.deepEqual(entries.map((e) => e[0]), ids);
  assert.deepEqual(entries[1][1], ['mid', 'b', 'x', 'y']);
  assert.equal(tail, ids[1]);
  const [otherRead] = await runScript(redis, 'read', [shard, owners], [group, 'm1', 'i2', 'm1', 10, '0-0', '']);
  assert.match(otherRead[0], /^FENCED/);
  const [refusedAck] = await runScript(redis, 'ack', [shard, owners], [group, 'm2', 'i1', 1, ids[0]]);
  assert.match(refusedAck, /^FENCED/);
  await assert.rejects(runScript(redis, 'claim', [shard, owners], [group, 'm1', 'other', 'm1', 0, 10, '0-0']), /FENCED/);
  await assert.rejects(runScript(redis, 'start', [shard, owners], [group, 'mX', 'i1', 'mX', ids[0]]), /FENCED/);
  // the owner: a redelivery counted, then acknowledged
  assert.equal(Number(await runScript(redis, 'start', [shard, owners], [group, 'm1', 'i1', 'm1', ids[0]])), 2);
  const [acked] = await runScript(redis, 'ack', [shard, owners], [group, 'm1', 'i1', 2, ...ids]);
  assert.equal(acked, 2);
  assert.equal((await redis.xpending(shard, group))[0], 0);
});

test('a sealed shard refuses appends; the producer refreshes its layout and re-routes', async (t) => {
  const a = `${p}st:{st:0}`;
  const b = `${p}st:{st:1}`;
  await redis.set(sealKey(a), '2');
  await assert.rejects(runScript(redis, 'append', appendKeys(a, 'p'), ['', 0, 0, 0, 1, 2, 'k', 'v']), /^ReplyError: SEALED|SEALED/);
  // A fake coordinator: version 1 routes everything to shard a, version 2 has a DRAINING.
  let version = 1;
  const layouts = {
    1: { metadataVersion: 1, routing: 'jump-v1', shards: [{ index: 0, key: a, state: 'ACTIVE' }] },
    2: { metadataVersion: 2, routing: 'jump-v1', shards: [{ index: 0, key: a, state: 'DRAINING' }, { index: 1, key: b, state: 'ACTIVE' }] },
  };
  const coordinator = new Coordinator({
    urls: 'http://fake',
    fetch: async (_url, init) => {
      const body = JSON.parse(String(init?.body));
      const answer = {
        status: 'OK', producerId: body.producerId, metadataVersion: version, routing: 'jump-v1', shardCount: 1,
        paused: false, heartbeatIntervalMs: 1000, leaseTtlMs: 5000,
        layout: body.metadataVersion === version ? null : layouts[version],
      };
      return new Response(JSON.stringify(answer), { status: 200 });
    },
  });
  const producer = new Producer({ coordinator, redis, stream: 'st', log: () => {} });
  await producer.heartbeat();
  assert.equal(producer.metadataVersion, 1);
  version = 2;
  const ids = await producer.publishMany([{ key: 'x', fields: { n: '1' } }, { key: 'y', fields: { n: '2' } }]);
  assert.equal(producer.metadataVersion, 2);
  assert.equal(await redis.xlen(a), 0);
  assert.deepEqual((await redis.xrange(b, '-', '+')).map((e) => e[0]), ids);
});

test('a full shard (retention whenFull refuse) refuses appends; the producer reports it, waits for room, then ShardFull', async (t) => {
  const a = `${p}full:{full:0}`;
  await redis.set(capKey(a), '2');
  await runScript(redis, 'append', appendKeys(a, 'p'), ['', 0, 0, 0, 2, 2, 'k', 'v', 2, 'k', 'w']);
  await assert.rejects(runScript(redis, 'append', appendKeys(a, 'p'), ['', 0, 0, 0, 1, 2, 'k', 'v']), /FULL/);
  assert.equal(await redis.xlen(a), 2);
  const layout = { metadataVersion: 1, routing: 'jump-v1', shards: [{ index: 0, key: a, state: 'ACTIVE' }] };
  /** @type {any[]} */
  const reports = [];
  let trims = false;
  const coordinator = new Coordinator({
    urls: 'http://fake',
    fetch: async (_url, init) => {
      const body = JSON.parse(String(init?.body));
      if (body.fullShards) {
        reports.push(body.fullShards);
        if (trims) await redis?.xtrim(a, 'MAXLEN', 0); // the coordinator's early trim
      }
      const answer = {
        status: 'OK', producerId: body.producerId, metadataVersion: 1, routing: 'jump-v1', shardCount: 1,
        paused: false, heartbeatIntervalMs: 60_000, leaseTtlMs: 5000, layout: body.metadataVersion === 1 ? null : layout,
      };
      return new Response(JSON.stringify(answer), { status: 200 });
    },
  });
  const producer = new Producer({ coordinator, redis, stream: 'full', deliveryTimeoutMs: 300, log: () => {} });
  await producer.heartbeat();
  assert.deepEqual(reports, []); // nothing full yet: no fullShards sent
  await assert.rejects(producer.publish('x', { n: '1' }), (err) => err instanceof ShardFull && err.shard === a);
  assert.deepEqual(reports[0], [0]); // reported at once, not at the next (60 s) heartbeat
  assert.ok(reports.length <= 2, `at most one report every 500 ms: ${reports.length}`);
  // the report makes room (the coordinator trims): the waiting publish goes through
  trims = true;
  const waiting = new Producer({ coordinator, redis, stream: 'full', deliveryTimeoutMs: 5000, log: () => {} });
  await waiting.heartbeat();
  const id = await waiting.publish('x', { n: '2' });
  assert.deepEqual((await redis.xrange(a, '-', '+')).map((e) => e[0]), [id]);
});

test('NOSCRIPT: the script is sent again with EVAL', async () => {
  const calls = [];
  const fake = {
    evalsha: async (...a) => { calls.push(['evalsha', ...a]); throw new Error('NOSCRIPT No matching script.'); },
    eval: async (...a) => { calls.push(['eval', ...a]); return 'ok'; },
  };
  assert.equal(await runScript(fake, 'start', ['k', 'o'], ['g']), 'ok');
  assert.equal(calls[0][1], SCRIPTS.start.sha);
  assert.ok(calls[1][1].equals(SCRIPTS.start.body));
  assert.deepEqual(calls[1].slice(2), [2, 'k', 'o', 'g']);
});

test('script SHA1s are what Redis computes', async (t) => {
  for (const s of Object.values(SCRIPTS)) assert.equal(await redis.script('LOAD', s.body), s.sha);
});

test('idempotent: a reply lost after Redis appended is sent again as it was and answered as a repeat', async (t) => {
  const a = `${p}idem:{idem:0}`;
  const real = /** @type {any} */ (redis);
  let cut = 2; // the first two appends run in Redis, then their replies are lost
  const lossy = {
    evalsha: async (/** @type {any[]} */ ...args) => {
      const reply = await real.evalsha(...args);
      if (cut-- > 0) throw Object.assign(new Error('Connection is closed.'), { name: 'Error' });
      return reply;
    },
    eval: (/** @type {any[]} */ ...args) => real.eval(...args),
  };
  const layout = { metadataVersion: 1, routing: 'jump-v1', shards: [{ index: 0, key: a, state: 'ACTIVE' }] };
  /** @type {any[]} */
  const bodies = [];
  const coordinator = new Coordinator({
    urls: 'http://fake',
    fetch: async (_url, init) => {
      const body = JSON.parse(String(init?.body));
      bodies.push(body);
      const answer = {
        status: 'OK', producerId: body.producerId, metadataVersion: 1, routing: 'jump-v1', shardCount: 1,
        paused: false, heartbeatIntervalMs: 60_000, leaseTtlMs: 5000, layout: body.metadataVersion === 1 ? null : layout,
        producerEpoch: 7,
      };
      return new Response(JSON.stringify(answer), { status: 200 });
    },
  });
  const producer = new Producer({ coordinator, redis: lossy, stream: 'idem', producerId: 'p-idem', log: () => {} });
  await producer.heartbeat();
  assert.equal(bodies[0].producerEpoch, 0); // a new process asks for an epoch
  assert.equal(producer.epoch, 7);
  const ids = await producer.publishMany([['x', { n: '1' }], ['y', { n: '2' }]]);
  assert.equal(producer.repeats, 1);
  assert.deepEqual((await redis.xrange(a, '-', '+')).map((e) => e[0]), ids); // appended once
  const more = await producer.publish('z', { n: '3' }); // the second cut: also answered once
  assert.equal(await redis.xlen(a), 3);
  assert.deepEqual((await redis.xrange(a, '-', '+')).map((e) => e[0]), [...ids, more]);
  await producer.heartbeat();
  assert.equal(bodies.at(-1).producerEpoch, 7); // it keeps the epoch it was given
});
