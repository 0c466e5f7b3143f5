// The poller against a real Redis, without a coordinator (owner tokens written here): woken by a
// blocking XREAD instead of polling, several shards per read.lua and ack.lua call, a revoke that
// ends the blocked read at once, drain progress of DRAINING shards.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Poller, keySlot, monotonic } from '../src/poller.js';
import { SCRIPTS, appendKeys, ownersKey, runScript } from '../src/scripts.js';
import { deleteKeys, prefix, connectRedis } from './helpers.js';

/** @type {any} */
let redis = null;
const p = prefix();
const group = 'g';
const SHARDS = 8;
const keys = Array.from({ length: SHARDS }, (_, i) => `${p}orders:{orders:${i}}`);
const layout = { shards: keys.map((key, index) => ({ index, key, state: index === 7 ? 'DRAINING' : 'ACTIVE' })) };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

before(async () => {
  redis = await connectRedis();
  if (!redis) return;
  for (const key of keys) {
    await redis.xgroup('CREATE', key, group, '0', 'MKSTREAM');
    await redis.hset(ownersKey(key), group, JSON.stringify({ memberId: 'm1', incarnation: 'i1', memberEpoch: 1 }));
  }
});
after(async () => {
  if (redis) {
    await deleteKeys(redis, p);
    redis.disconnect();
  }
});

/** Count the commands sent on `client` (every ioredis command goes through sendCommand). */
function countCommands(client) {
  const counts = { all: 0, /** @type {Record<string, number>} */ scripts: {} };
  const shaNames = Object.fromEntries(Object.values(SCRIPTS).map((s) => [s.sha, s.name]));
  const send = client.sendCommand.bind(client);
  client.sendCommand = (command, ...rest) => {
    counts.all += 1;
    if (command.name === 'evalsha') {
      const name = shaNames[String(command.args[0])] ?? '?';
      counts.scripts[name] = (counts.scripts[name] ?? 0) + 1;
    }
    return send(command, ...rest);
  };
  return counts;
}

async function until(check, ms, what) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return;
    await sleep(5);
  }
  throw new Error(`timed out: ${what}`);
}

const append = (key, mid) => runScript(redis, 'append', appendKeys(key, 'test'), ['', 0, 0, 0, 1, 2, 'mid', mid]);

test('idle shards cost a blocked XREAD, not polls; entries of several shards come in one read and one ack call', async (t) => {
  const client = redis.duplicate();
  client.on('error', () => {});
  const counts = countCommands(client);
  /** @type {string[]} */
  const handled = [];
  const poller = new Poller({
    redis: client, group, memberId: 'm1', incarnation: 'i1', concurrency: 8, log: () => {},
    settings: { reclaimEveryMs: 60_000 },
    handler: async (m) => { handled.push(m.fields.mid); await sleep(1); },
  });
  try {
    poller.renewed(monotonic() + 60);
    poller.assigned(layout.shards.map((s) => s.index), layout);
    // caught up on every shard, then blocked in one XREAD on a connection of its own
    await until(() => poller.wakeConnectionsOpen === 1 && poller.wakeReads >= 1, 3000, 'a wake-up read');
    assert.equal(poller.watches.size, 1, 'one bundle on a standalone Redis');
    const before = counts.all;
    const reads = poller.wakeReads;
    await sleep(1500);
    assert.ok(counts.all - before <= 1, `idle: ${counts.all - before} commands in 1.5 s on the main connection`);
    assert.ok(poller.wakeReads - reads <= 1, `idle: ${poller.wakeReads - reads} wake-up reads in 1.5 s`);

    // an append wakes it at once
    const t0 = Date.now();
    await append(keys[3], 'a');
    await until(() => handled.includes('a'), 2000, 'the entry handled');
    assert.ok(Date.now() - t0 < 500, `woken in ${Date.now() - t0} ms`);

    // entries on four shards at once: read together, acknowledged together
    const acksBefore = counts.scripts.ack ?? 0;
    const pipe = redis.multi();
    for (const i of [0, 1, 2, 5]) {
      const script = SCRIPTS.append;
      pipe.evalsha(script.sha, 4, ...appendKeys(keys[i], 'test'), '', 0, 0, 0, 1, 2, 'mid', `b${i}`);
    }
    await pipe.exec();
    await until(() => ['b0', 'b1', 'b2', 'b5'].every((m) => handled.includes(m)), 3000, 'four entries handled');
    await until(async () => {
      for (const i of [0, 1, 2, 5]) {
        const [info] = (await redis.xinfo('GROUPS', keys[i])).map((flat) => Object.fromEntries(
          flat.reduce((acc, v, j) => (j % 2 ? acc[acc.length - 1].push(v) : acc.push([v]), acc), [])));
        if (Number(info.pending) !== 0) return false;
      }
      return true;
    }, 2000, 'acknowledged');
    const ackCalls = (counts.scripts.ack ?? 0) - acksBefore;
    assert.ok(ackCalls >= 1 && ackCalls < 4, `four acknowledgements in ${ackCalls} ack.lua calls`);
  } finally {
    await poller.close();
    client.disconnect();
  }
});

test('a revoke ends the blocked read by closing its connection; drain progress of a DRAINING shard', async (t) => {
  const client = redis.duplicate();
  client.on('error', () => {});
  const poller = new Poller({
    redis: client, group, memberId: 'm1', incarnation: 'i1', concurrency: 2, log: () => {},
    settings: { reclaimEveryMs: 100 }, handler: () => {},
  });
  try {
    poller.renewed(monotonic() + 60);
    poller.assigned([6, 7], layout);
    await until(() => poller.wakeConnectionsOpen === 1, 3000, 'a wake-up read');
    await until(() => poller.drainProgress().length === 1, 3000, 'drain progress measured');
    assert.deepEqual(poller.drainProgress(), [{ shard: 7, pending: 0, lag: 0 }]);
    const opened = poller.wakeConnections;
    const t0 = Date.now();
    await poller.revoke([6, 7], 5);
    assert.ok(Date.now() - t0 < 1000, `revoked in ${Date.now() - t0} ms`);
    assert.equal(poller.wakeConnectionsOpen, 0, 'its connection closed');
    assert.equal(poller.watches.size, 0);
    assert.equal(poller.wakeConnections, opened);
    assert.deepEqual(poller.drainProgress(), []);
  } finally {
    await poller.close();
    client.disconnect();
  }
});

test('hash slots as Redis Cluster computes them', () => {
  assert.equal(keySlot('foo'), 12182);
  assert.equal(keySlot('{user1000}.following'), keySlot('{user1000}.followers'));
  assert.equal(keySlot('123456789'), 12739);
  assert.equal(keySlot('a{}b'), keySlot('a{}b'));
});
