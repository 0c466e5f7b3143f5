// The data-plane scripts (lua/*.lua, byte-identical copies of rsc/lua/member/*.lua), called by
// EVALSHA; on NOSCRIPT (Redis restarted, failed over, or a cluster node that never saw it) the
// script is sent again with EVAL, which also loads it on the node that owns the keys.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const LUA_DIR = join(dirname(dirname(fileURLToPath(import.meta.url))), 'lua');
export const SCRIPT_NAMES = ['ack', 'append', 'claim', 'dead_letter', 'read', 'reclaim', 'start'];

/** @typedef {{name: string, body: Buffer, sha: string}} Script */

/** @type {Record<string, Script>} */
export const SCRIPTS = {};
for (const name of SCRIPT_NAMES) {
  const body = readFileSync(join(LUA_DIR, `${name}.lua`));
  SCRIPTS[name] = { name, body, sha: createHash('sha1').update(body).digest('hex') };
}

export const OWNERS_SUFFIX = ':rsc:v1:owners';
export const SEAL_SUFFIX = ':rsc:v1:seal';
export const DEAD_LETTER_SUFFIX = ':dlq';
export const CAP_SUFFIX = ':rsc:v1:cap';
/** @param {string} shardKey */
export const capKey = (shardKey) => shardKey + CAP_SUFFIX;
/** @param {string} shardKey */
export const ownersKey = (shardKey) => shardKey + OWNERS_SUFFIX;
/** @param {string} shardKey */
export const sealKey = (shardKey) => shardKey + SEAL_SUFFIX;
export const PRODUCER_SUFFIX = ':rsc:v1:producer:';
/**
 * The keys of append.lua: the shard, its seal, its cap, and the producer's record on it.
 * @param {string} shardKey @param {string} producerId
 */
export const appendKeys = (shardKey, producerId) => [
  shardKey, sealKey(shardKey), capKey(shardKey), shardKey + PRODUCER_SUFFIX + producerId,
];
/** @param {string} shardKey */
export const deadLetterKey = (shardKey) => shardKey + DEAD_LETTER_SUFFIX;

/**
 * Run a script: EVALSHA, and EVAL of the file on NOSCRIPT.
 * @param {import('ioredis').Redis | import('ioredis').Cluster} redis
 * @param {string} name
 * @param {(string|number)[]} keys
 * @param {(string|number|Buffer)[]} args
 * @returns {Promise<any>}
 */
export async function runScript(redis, name, keys, args) {
  const script = SCRIPTS[name];
  if (!script) throw new Error(`unknown script ${name}`);
  try {
    return await redis.evalsha(script.sha, keys.length, ...keys, ...args);
  } catch (err) {
    if (err && typeof err.message === 'string' && err.message.startsWith('NOSCRIPT')) {
      return await redis.eval(script.body, keys.length, ...keys, ...args);
    }
    throw err;
  }
}

/** A reply or error text that is an owner-token refusal. @param {unknown} x */
export function isFenced(x) {
  const text = x instanceof Error ? x.message : typeof x === 'string' ? x : '';
  return text.startsWith('FENCED');
}
