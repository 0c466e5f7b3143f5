import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Router, jump, route, routingHash } from '../src/routing.js';

const here = dirname(fileURLToPath(import.meta.url));
const vectors = JSON.parse(readFileSync(join(here, '..', 'vectors', 'jump-v1.json'), 'utf8'));

const keyOf = (v) => Buffer.from(v.keyHex, 'hex');

test('the vectors are jump-v1', () => {
  assert.equal(vectors.protocol, 'jump-v1');
  assert.ok(vectors.vectors.length >= 100);
});

test('routing hash of every vector key', () => {
  for (const v of vectors.vectors) {
    assert.equal(routingHash(keyOf(v)).toString(16).padStart(16, '0'), v.hash, `key ${v.keyHex}`);
    if (typeof v.key === 'string') {
      assert.equal(routingHash(v.key).toString(16).padStart(16, '0'), v.hash, `text key ${v.key}`);
    }
  }
});

test('buckets for every shard count', () => {
  for (const v of vectors.vectors) {
    const h = BigInt('0x' + v.hash);
    vectors.counts.forEach((n, i) => assert.equal(jump(h, n), v.buckets[i], `key ${v.keyHex} n=${n}`));
  }
});

test('routes in layouts with retired and draining shards', () => {
  for (const layout of vectors.layouts) {
    vectors.vectors.forEach((v, i) => {
      assert.equal(route(layout, keyOf(v)).index, layout.routes[i], `key ${v.keyHex}`);
    });
  }
});

test('a Router routes as route does, bytes and text keys, from its cache too', () => {
  for (const layout of vectors.layouts) {
    const router = new Router(layout);
    for (const round of [1, 2]) {
      vectors.vectors.forEach((v, i) => {
        assert.equal(router.shard(keyOf(v)).index, layout.routes[i], `key ${v.keyHex}, round ${round}`);
        if (typeof v.key === 'string') assert.equal(router.shard(v.key).index, layout.routes[i], `text key ${v.key}`);
      });
    }
  }
  assert.throws(() => new Router({ routing: 'other', shards: [] }), /unsupported routing/);
  assert.throws(() => new Router({ shards: [] }).shard('k'), /no ACTIVE shard/);
});

test('the table of docs/routing.md', () => {
  const table = [
    ['', 'e3b0c44298fc1c14', [0, 1, 2, 2, 5, 5, 22, 22]],
    ['a', 'ca978112ca1bbdca', [0, 1, 1, 1, 1, 1, 50, 912]],
    ['order-42', '3bf8b157c4238eef', [0, 1, 2, 2, 2, 2, 63, 300]],
    ['customer:1001', '7e1829d071507f91', [0, 0, 2, 2, 2, 12, 74, 831]],
    ['Grüße', 'f83e039796c6453a', [0, 1, 2, 3, 3, 9, 34, 973]],
  ];
  const ns = [1, 2, 3, 4, 8, 16, 100, 1000];
  for (const [key, hash, buckets] of table) {
    const h = routingHash(key);
    assert.equal(h.toString(16).padStart(16, '0'), hash);
    ns.forEach((n, i) => assert.equal(jump(h, n), buckets[i]));
  }
});
