// Routing protocol `jump-v1` (docs/routing.md): the first 8 bytes of SHA-256(key) as an
// unsigned big-endian 64-bit integer, then Lamping and Veach's jump consistent hash over the
// layout's ACTIVE shards in index order, with 64-bit wrap-around (BigInt) and IEEE doubles.
import { createHash } from 'node:crypto';

export const ROUTING = 'jump-v1';
const MASK = (1n << 64n) - 1n;
const MULT = 2862933555777941757n;

/**
 * The key as bytes: a string is UTF-8, a Buffer/Uint8Array is taken as is.
 * @param {string | Uint8Array} key
 * @returns {Buffer}
 */
export function keyBytes(key) {
  if (typeof key === 'string') return Buffer.from(key, 'utf8');
  if (key instanceof Uint8Array) return Buffer.from(key.buffer, key.byteOffset, key.byteLength);
  throw new TypeError('a routing key is a string or bytes');
}

/**
 * The routing hash: the first 8 bytes of SHA-256(key), big-endian, unsigned.
 * @param {string | Uint8Array} key
 * @returns {bigint}
 */
export function routingHash(key) {
  return createHash('sha256').update(keyBytes(key)).digest().readBigUInt64BE(0);
}

/**
 * Jump consistent hash of `h` over `n` buckets.
 * @param {bigint} h
 * @param {number} n
 * @returns {number}
 */
export function jump(h, n) {
  if (!Number.isInteger(n) || n < 1) throw new RangeError('jump needs n >= 1');
  let b = -1;
  let j = 0;
  h &= MASK;
  while (j < n) {
    b = j;
    h = (h * MULT + 1n) & MASK;
    j = Math.floor((b + 1) * (2147483648 / (Number(h >> 33n) + 1)));
  }
  return b;
}

/**
 * @typedef {{index: number, key?: string, state?: string}} ShardSpec
 * @typedef {{metadataVersion?: number, shards: ShardSpec[], routing?: string}} Layout
 */

/**
 * The ACTIVE shards of a layout in ascending index order (a missing state counts as ACTIVE).
 * @param {Layout} layout
 * @returns {ShardSpec[]}
 */
export function activeShards(layout) {
  return layout.shards
    .filter((s) => (s.state ?? 'ACTIVE') === 'ACTIVE')
    .sort((a, b) => a.index - b.index);
}

/**
 * The shard a key routes to in `layout`.
 * @param {Layout} layout
 * @param {string | Uint8Array} key
 * @returns {ShardSpec}
 */
export function route(layout, key) {
  if (layout.routing && layout.routing !== ROUTING) {
    throw new Error(`unsupported routing protocol ${layout.routing} (this client speaks ${ROUTING})`);
  }
  const active = activeShards(layout);
  if (active.length === 0) throw new Error('the layout has no ACTIVE shard');
  return active[jump(routingHash(key), active.length)];
}

/** Keys a `Router` remembers the shard of, at most (then it starts again). */
export const ROUTE_CACHE = 100_000;

/** `route` for many keys under one layout: the ACTIVE shards picked out once, and the shard of
 * each string key remembered (keys repeat: hashing each once is enough). */
export class Router {
  /** @param {Layout} layout */
  constructor(layout) {
    if (layout.routing && layout.routing !== ROUTING) {
      throw new Error(`unsupported routing protocol ${layout.routing} (this client speaks ${ROUTING})`);
    }
    this.layout = layout;
    this.active = activeShards(layout);
    /** @type {Map<string, ShardSpec>} */
    this.known = new Map();
  }

  /** The shard `key` routes to. @param {string | Uint8Array} key @returns {ShardSpec} */
  shard(key) {
    if (this.active.length === 0) throw new Error('the layout has no ACTIVE shard');
    if (typeof key !== 'string') return this.active[jump(routingHash(key), this.active.length)];
    let shard = this.known.get(key);
    if (shard === undefined) {
      shard = this.active[jump(routingHash(key), this.active.length)];
      if (this.known.size >= ROUTE_CACHE) this.known.clear();
      this.known.set(key, shard);
    }
    return shard;
  }
}
