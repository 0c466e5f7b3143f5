/**
 * @typedef {object} ParsedUrl
 * @property {'standalone'|'sentinel'} kind
 * @property {boolean} tls
 * @property {{host: string, port: number}[]} hosts
 * @property {string} [username]
 * @property {string} [password]
 * @property {number} db
 * @property {string} [service]
 * @property {Record<string,string>} query
 */
/**
 * @param {string} url
 * @returns {ParsedUrl}
 */
export function parseRedisUrl(url: string): ParsedUrl;
/**
 * A client for `url`, without the cluster probe (standalone or sentinel; `?cluster=1` makes a Cluster).
 * @param {string} url
 * @param {object} [extra] ioredis options
 * @returns {Redis | Cluster}
 */
export function createRedis(url: string, extra?: object): Redis | Cluster;
/**
 * A client for `url`: a redis:// node that reports `cluster_enabled:1` gives a Cluster client.
 * When Redis cannot be reached now, a standalone client is returned (it reconnects by itself).
 * @param {string} url
 * @param {object} [extra]
 * @returns {Promise<Redis | Cluster>}
 */
export function connectRedis(url: string, extra?: object): Promise<Redis | Cluster>;
/** Whether an error means Redis cannot answer now but may soon (retry with backoff).
 * @param {unknown} err */
export function isTransient(err: unknown): boolean;
export const DEFAULT_REDIS_URL: "redis://127.0.0.1:6379";
export type ParsedUrl = {
    kind: "standalone" | "sentinel";
    tls: boolean;
    hosts: {
        host: string;
        port: number;
    }[];
    username?: string;
    password?: string;
    db: number;
    service?: string;
    query: Record<string, string>;
};
import { Redis } from 'ioredis';
import { Cluster } from 'ioredis';
