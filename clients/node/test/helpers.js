import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { Redis } from 'ioredis';

/** A free TCP port on 127.0.0.1. @returns {Promise<number>} */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/**
 * A private `redis-server` for this test file (on a free port, no persistence), stopped when
 * the process exits: the tests never depend on what the machine runs on 6379. Fails (never
 * skips) when `redis-server` cannot be started.
 * @returns {Promise<string>} its URL
 */
async function privateRedis() {
  const port = await freePort();
  const server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
    stdio: 'ignore',
  });
  server.unref();
  process.once('exit', () => server.kill('SIGKILL'));
  const failed = new Promise((_, reject) => server.once('error', (e) => reject(new Error(`redis-server did not start: ${e.message}`))));
  const url = `redis://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i += 1) {
    const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {});
    try {
      await Promise.race([probe.connect().then(() => probe.ping()), failed]);
      probe.disconnect();
      return url;
    } catch (error) {
      probe.disconnect();
      if (server.exitCode !== null || (error instanceof Error && error.message.startsWith('redis-server'))) throw error;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  throw new Error(`redis-server on port ${port} did not answer`);
}

/** `RSC_TEST_REDIS_URL` if set, else a private redis-server started for this file. */
export const REDIS_URL = process.env.RSC_TEST_REDIS_URL || (await privateRedis());

/** A connected client of `REDIS_URL` (throws when it does not answer: never a skip). */
export async function connectRedis() {
  const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  redis.on('error', () => {});
  await redis.connect();
  await redis.ping();
  return redis;
}

export const prefix = () => `rscnodetest:${randomBytes(4).toString('hex')}:`;

/** Delete every key under `p`. @param {Redis} redis @param {string} p */
export async function deleteKeys(redis, p) {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${p}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length) await redis.del(...keys);
  } while (cursor !== '0');
}
