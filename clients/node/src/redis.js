// Redis connections from the URL forms of docs/operations.md (rsc/connect.py):
//   redis://[[user]:password@]host[:port][/db]
//   rediss://...?ssl_ca_certs=/ca.pem[&ssl_certfile=..&ssl_keyfile=..&ssl_cert_reqs=none]   (TLS)
//   redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=..]
//   rediss+sentinel://...                                       (TLS to the data nodes)
// A redis:// URL is a Redis Cluster when the node says so (INFO cluster), or with ?cluster=1.
import { readFileSync } from 'node:fs';
import { Cluster, Redis } from 'ioredis';

export const DEFAULT_REDIS_URL = 'redis://127.0.0.1:6379';

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
export function parseRedisUrl(url) {
  const m = /^(redis|rediss|redis\+sentinel|rediss\+sentinel):\/\/(?:([^@/]*)@)?([^/?#]*)(\/[^?#]*)?(?:\?([^#]*))?$/.exec(url);
  if (!m) throw new Error(`not a Redis URL: ${url.replace(/\/\/[^@/]*@/, '//***@')}`);
  const [, scheme, auth, hostPart, path = '', queryText = ''] = m;
  const tls = scheme.startsWith('rediss');
  const sentinel = scheme.endsWith('+sentinel');
  let username;
  let password;
  if (auth !== undefined) {
    const colon = auth.indexOf(':');
    if (colon >= 0) {
      username = decodeURIComponent(auth.slice(0, colon)) || undefined;
      password = decodeURIComponent(auth.slice(colon + 1));
    } else {
      password = decodeURIComponent(auth) || undefined; // redis://secret@host: a password alone
    }
  }
  const hosts = (hostPart || '127.0.0.1').split(',').map((hp) => {
    const v6 = /^\[([^\]]+)\](?::(\d+))?$/.exec(hp);
    if (v6) return { host: v6[1], port: Number(v6[2] || (sentinel ? 26379 : 6379)) };
    const [host, port] = hp.split(':');
    return { host: host || '127.0.0.1', port: Number(port || (sentinel ? 26379 : 6379)) };
  });
  const segments = path.split('/').filter(Boolean).map(decodeURIComponent);
  const query = Object.fromEntries(new URLSearchParams(queryText));
  let service;
  let db = 0;
  if (sentinel) {
    if (!segments.length) throw new Error('a redis+sentinel:// URL names the service: /service[/db]');
    service = segments[0];
    if (segments[1] !== undefined) db = Number(segments[1]);
  } else if (segments[0] !== undefined) {
    db = Number(segments[0]);
  }
  if (!Number.isInteger(db) || db < 0) throw new Error(`bad database number in ${scheme}:// URL`);
  if (query.db !== undefined) db = Number(query.db);
  return { kind: sentinel ? 'sentinel' : 'standalone', tls, hosts, username, password, db, service, query };
}

/** @param {Record<string,string>} q */
function tlsOptions(q) {
  /** @type {import('node:tls').ConnectionOptions} */
  const tls = {};
  if (q.ssl_ca_certs) tls.ca = readFileSync(q.ssl_ca_certs);
  if (q.ssl_certfile) tls.cert = readFileSync(q.ssl_certfile);
  if (q.ssl_keyfile) tls.key = readFileSync(q.ssl_keyfile);
  if (q.ssl_cert_reqs === 'none' || q.ssl_cert_reqs === 'CERT_NONE') tls.rejectUnauthorized = false;
  if (q.ssl_check_hostname === 'false') tls.checkServerIdentity = () => undefined;
  return tls;
}

/** Options common to every connection: commands fail fast while Redis is away (the client
 * retries with its own backoff), reconnects go on forever. */
const COMMON = {
  maxRetriesPerRequest: 1,
  enableOfflineQueue: true,
  connectTimeout: 5000,
  retryStrategy: (/** @type {number} */ times) => Math.min(50 * 2 ** Math.min(times, 6), 2000),
  lazyConnect: false,
};

/**
 * A client for `url`, without the cluster probe (standalone or sentinel; `?cluster=1` makes a Cluster).
 * @param {string} url
 * @param {object} [extra] ioredis options
 * @returns {Redis | Cluster}
 */
export function createRedis(url, extra = {}) {
  const client = createRedisClient(url, extra);
  // Connection failures surface on the commands (retried there with backoff), not as events.
  client.on('error', () => {});
  return client;
}

/** @param {string} url @param {object} extra */
function createRedisClient(url, extra) {
  const p = parseRedisUrl(url);
  const auth = { username: p.username, password: p.password };
  const tls = p.tls ? { tls: tlsOptions(p.query) } : {};
  if (p.kind === 'sentinel') {
    return new Redis({
      ...COMMON,
      sentinels: p.hosts,
      name: p.service,
      db: p.db,
      ...auth,
      sentinelPassword: p.query.sentinel_password,
      sentinelUsername: p.query.sentinel_username,
      enableTLSForSentinelMode: p.tls,
      ...tls,
      ...extra,
    });
  }
  if (p.query.cluster === '1' || p.query.cluster === 'true') {
    return new Cluster(p.hosts, {
      redisOptions: { ...COMMON, ...auth, ...tls, ...extra },
      clusterRetryStrategy: COMMON.retryStrategy,
    });
  }
  return new Redis({ ...COMMON, host: p.hosts[0].host, port: p.hosts[0].port, db: p.db, ...auth, ...tls, ...extra });
}

/**
 * A client for `url`: a redis:// node that reports `cluster_enabled:1` gives a Cluster client.
 * When Redis cannot be reached now, a standalone client is returned (it reconnects by itself).
 * @param {string} url
 * @param {object} [extra]
 * @returns {Promise<Redis | Cluster>}
 */
export async function connectRedis(url, extra = {}) {
  const client = createRedis(url, extra);
  if (!(client instanceof Redis) || parseRedisUrl(url).kind !== 'standalone') return client;
  try {
    const info = await client.info('cluster');
    if (/cluster_enabled:1/.test(info)) {
      client.disconnect();
      const sep = url.includes('?') ? '&' : '?';
      return createRedis(`${url}${sep}cluster=1`, extra);
    }
  } catch {
    // not reachable yet: standalone it is
  }
  return client;
}

/** Whether an error means Redis cannot answer now but may soon (retry with backoff).
 * @param {unknown} err */
export function isTransient(err) {
  if (!(err instanceof Error)) return false;
  const msg = err.message || '';
  if (/^(LOADING|MASTERDOWN|BUSY|TRYAGAIN|CLUSTERDOWN|READONLY)\b/.test(msg)) return true;
  return err.name !== 'ReplyError';
}
