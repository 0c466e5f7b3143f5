// The member machine (a port of rsc/events/member_machine.py) and the coordinator transport.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Coordinator, CoordinatorAuthError, CoordinatorUnavailable } from '../src/coordinator.js';
import { MemberMachine } from '../src/machine.js';

const client = { name: 'test', version: '0' };
const answer = (o = {}) => ({
  status: 'OK', memberEpoch: 1, groupEpoch: 1, assignmentEpoch: 1, heartbeatIntervalMs: 1000, leaseTtlMs: 10_000,
  metadataVersion: 1, maxConcurrency: 1, revokeTimeoutMs: 5000,
  layout: { metadataVersion: 1, shards: [0, 1, 2, 3].map((i) => ({ index: i, key: `s:${i}`, state: 'ACTIVE' })) },
  assignment: { assigned: [0, 1, 2, 3], pending: [], revoke: [] }, ...o,
});
const machine = (settings = {}) => new MemberMachine({ streamPrefix: 's', group: 'g', memberId: 'm', incarnation: 'i', client, settings });
const sorted = (s) => [...s].sort((a, b) => a - b);

test('join, then the lease counts from the send time less 20 %', () => {
  const m = machine();
  const r = m.request(100);
  assert.equal(r.memberEpoch, 0);
  assert.equal(r.protocolVersion, 2);
  const steps = m.receive(r, answer(), 103); // answered 3 s after it was sent
  assert.deepEqual(sorted(steps.start), [0, 1, 2, 3]);
  assert.equal(steps.renewUntil, 100 + 10 * 0.8);
  assert.equal(m.fenceAt, 108);
  assert.equal(m.request(104).memberEpoch, 1);
});

test('no heartbeat succeeds within the lease: every shard dropped (self-fencing)', () => {
  const m = machine();
  const r = m.request(0);
  m.receive(r, answer(), 0.1);
  const r2 = m.request(1);
  const failed = m.failed(r2, 2, 'refused');
  assert.equal(failed.lost.size, 0);
  assert.ok(m.nextHeartbeatAt(2) <= 2.5);
  const late = m.silent(8.01);
  assert.deepEqual(sorted(late.lost), [0, 1, 2, 3]);
  assert.equal(late.renewUntil, -Infinity);
  // a late answer to a request sent before the pause renews nothing useful
  const r3 = m.request(8.02);
  const back = m.receive(r3, answer({ status: 'FENCED', fenceReason: 'LEASE_EXPIRED', memberEpoch: 0 }), 30);
  assert.equal(m.epoch, 0);
  assert.equal(back.lost.size, 0);
  assert.equal(m.request(30).memberEpoch, 0);
});

test('revoke: stop, report owned until revoked, then acknowledge', () => {
  const m = machine();
  m.receive(m.request(0), answer(), 0);
  const r = m.request(1);
  const steps = m.receive(r, answer({ status: 'REVOKE_PENDING', assignment: { assigned: [0, 1], pending: [], revoke: [2, 3] } }), 1);
  assert.deepEqual(sorted(steps.stop), [2, 3]);
  assert.deepEqual(m.request(1.1).ownedShards, [0, 1, 2, 3]);
  m._sent = null;
  m.revoked(new Set([2, 3]));
  assert.equal(m.nextHeartbeatAt(1.2), 1.2);
  const ack = m.request(1.2);
  assert.deepEqual(ack.ownedShards, [0, 1]);
  assert.deepEqual(ack.revokedShards, [2, 3]);
  m.receive(ack, answer({ assignment: { assigned: [0, 1], pending: [], revoke: [] } }), 1.3);
  assert.deepEqual(m.request(2).revokedShards, []);
});

test('FENCED REPLACED stops for good; a static member says so', () => {
  const m = machine({ static: true });
  const r = m.request(0);
  assert.equal(r.static, true);
  m.receive(r, answer(), 0);
  const s = m.receive(m.request(1), answer({ status: 'FENCED', fenceReason: 'REPLACED' }), 1);
  assert.deepEqual(sorted(s.lost), [0, 1, 2, 3]);
  assert.ok(s.replaced);
  assert.equal(m.left, true);
  assert.equal(m.nextHeartbeatAt(2), Infinity);
});

test('graceful leave: leaving, revokes, then epoch -1', () => {
  const m = machine();
  m.receive(m.request(0), answer({ assignment: { assigned: [0], pending: [], revoke: [] } }), 0);
  m.stop();
  const r = m.request(1);
  assert.equal(r.leaving, true);
  const s = m.receive(r, answer({ assignment: { assigned: [], pending: [], revoke: [0] } }), 1);
  assert.deepEqual(sorted(s.stop), [0]);
  m.revoked(new Set([0]));
  const bye = m.request(1.1);
  assert.equal(bye.memberEpoch, -1);
  m.receive(bye, answer({ memberEpoch: -1 }), 1.2);
  assert.equal(m.left, true);
});

test('SYNC_METADATA takes the layout and drops what assigned does not give', () => {
  const m = machine();
  m.receive(m.request(0), answer(), 0);
  const layout = { metadataVersion: 1, shards: [{ index: 0, key: 's:0', state: 'ACTIVE' }] };
  const s = m.receive(m.request(1), answer({ status: 'SYNC_METADATA', layout, assignment: { assigned: [0], pending: [], revoke: [] } }), 1);
  assert.deepEqual(sorted(s.stop), [1, 2, 3]);
  assert.equal(m.layout, layout);
});

/** A tiny HTTP server answering `status` with `body`. */
async function server(status, body, headers = {}) {
  const srv = createServer((req, res) => {
    req.resume();
    req.on('end', () => { res.writeHead(status, { 'content-type': 'application/json', ...headers }); res.end(JSON.stringify(body)); });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return { srv, url: `http://127.0.0.1:${srv.address().port}` };
}

test('coordinator URLs: a standby (503) and a refused connection are skipped', async () => {
  const standby = await server(503, { error: 'STANDBY', message: 'standby', requestId: 'x' });
  const active = await server(200, { ok: 1 });
  try {
    const c = new Coordinator({ urls: `http://127.0.0.1:1,${standby.url},${active.url}` });
    assert.deepEqual(await c.post('/v1/heartbeat', {}), { ok: 1 });
    assert.equal(c.current, 2);
    const limited = await server(429, { error: 'RATE_LIMITED', message: 'slow', requestId: 'x' }, { 'retry-after': '2' });
    try {
      const c2 = new Coordinator({ urls: limited.url });
      await assert.rejects(c2.post('/v1/heartbeat', {}), (e) => e instanceof CoordinatorUnavailable && e.retryAfterMs === 2000);
    } finally { limited.srv.close(); }
  } finally {
    standby.srv.close();
    active.srv.close();
  }
});

test('401: a typed error; the conformance client exits 2 with one stderr line', async () => {
  const refused = await server(401, { error: 'UNAUTHENTICATED', message: 'bad token', requestId: 'x' });
  try {
    const c = new Coordinator({ urls: refused.url, token: 'nope' });
    await assert.rejects(c.post('/v1/heartbeat', {}), CoordinatorAuthError);
    const bin = join(dirname(fileURLToPath(import.meta.url)), '..', 'bin', 'conformance-client.js');
    const child = spawn(process.execPath, [bin], {
      env: { ...process.env, RSC_COORDINATOR_URL: refused.url, RSC_TOKEN: 'nope', RSC_REDIS_URL: 'redis://127.0.0.1:1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { err += d; });
    const code = await new Promise((r) => child.on('exit', r));
    assert.equal(code, 2);
    assert.equal(out, '');
    assert.equal(err.trim().split('\n').length, 1, err);
    assert.match(err, /401/);
  } finally {
    refused.srv.close();
  }
});
