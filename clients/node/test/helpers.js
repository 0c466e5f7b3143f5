import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';

export const REDIS_URL = process.env.RSC_TEST_REDIS_URL || 'redis://127.0.0.1:6379';

/** A connected client, or null when no Redis answers (the tests then skip). */
export async function redisOrNull() {
  const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  redis.on('error', () => {});
  try {
    await redis.connect();
    await redis.ping();
    return redis;
  } catch {
    redis.disconnect();
    return null;
  }
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
