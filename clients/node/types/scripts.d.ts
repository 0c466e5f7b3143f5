/**
 * Run a script: EVALSHA, and EVAL of the file on NOSCRIPT.
 * @param {import('ioredis').Redis | import('ioredis').Cluster} redis
 * @param {string} name
 * @param {(string|number)[]} keys
 * @param {(string|number|Buffer)[]} args
 * @returns {Promise<any>}
 */
export function runScript(redis: import("ioredis").Redis | import("ioredis").Cluster, name: string, keys: (string | number)[], args: (string | number | Buffer)[]): Promise<any>;
/** A reply or error text that is an owner-token refusal. @param {unknown} x */
export function isFenced(x: unknown): boolean;
export const LUA_DIR: string;
export const SCRIPT_NAMES: string[];
/** @typedef {{name: string, body: Buffer, sha: string}} Script */
/** @type {Record<string, Script>} */
export const SCRIPTS: Record<string, Script>;
export const OWNERS_SUFFIX: ":rsc:v1:owners";
export const SEAL_SUFFIX: ":rsc:v1:seal";
export const DEAD_LETTER_SUFFIX: ":dlq";
export const CAP_SUFFIX: ":rsc:v1:cap";
export function capKey(shardKey: string): string;
export function ownersKey(shardKey: string): string;
export function sealKey(shardKey: string): string;
export const PRODUCER_SUFFIX: ":rsc:v1:producer:";
export function appendKeys(shardKey: string, producerId: string): string[];
export function deadLetterKey(shardKey: string): string;
export type Script = {
    name: string;
    body: Buffer;
    sha: string;
};
