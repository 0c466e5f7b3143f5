/**
 * The key as bytes: a string is UTF-8, a Buffer/Uint8Array is taken as is.
 * @param {string | Uint8Array} key
 * @returns {Buffer}
 */
export function keyBytes(key: string | Uint8Array): Buffer;
/**
 * The routing hash: the first 8 bytes of SHA-256(key), big-endian, unsigned.
 * @param {string | Uint8Array} key
 * @returns {bigint}
 */
export function routingHash(key: string | Uint8Array): bigint;
/**
 * Jump consistent hash of `h` over `n` buckets.
 * @param {bigint} h
 * @param {number} n
 * @returns {number}
 */
export function jump(h: bigint, n: number): number;
/**
 * @typedef {{index: number, key?: string, state?: string}} ShardSpec
 * @typedef {{metadataVersion?: number, shards: ShardSpec[], routing?: string}} Layout
 */
/**
 * The ACTIVE shards of a layout in ascending index order (a missing state counts as ACTIVE).
 * @param {Layout} layout
 * @returns {ShardSpec[]}
 */
export function activeShards(layout: Layout): ShardSpec[];
/**
 * The shard a key routes to in `layout`.
 * @param {Layout} layout
 * @param {string | Uint8Array} key
 * @returns {ShardSpec}
 */
export function route(layout: Layout, key: string | Uint8Array): ShardSpec;
export const ROUTING: "jump-v1";
/** Keys a `Router` remembers the shard of, at most (then it starts again). */
export const ROUTE_CACHE: 100000;
/** `route` for many keys under one layout: the ACTIVE shards picked out once, and the shard of
 * each string key remembered (keys repeat: hashing each once is enough). */
export class Router {
    /** @param {Layout} layout */
    constructor(layout: Layout);
    layout: Layout;
    active: ShardSpec[];
    /** @type {Map<string, ShardSpec>} */
    known: Map<string, ShardSpec>;
    /** The shard `key` routes to. @param {string | Uint8Array} key @returns {ShardSpec} */
    shard(key: string | Uint8Array): ShardSpec;
}
export type ShardSpec = {
    index: number;
    key?: string;
    state?: string;
};
export type Layout = {
    metadataVersion?: number;
    shards: ShardSpec[];
    routing?: string;
};
