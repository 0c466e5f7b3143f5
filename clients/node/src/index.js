// rsc-client: the Node.js reference client of rsc. createWorker (a member of a consumer group:
// heartbeats, shard assignment, fenced reads and acks) and createProducer (jump-v1 routing,
// fenced appends).
import { hostname } from 'node:os';
import { Coordinator, HeartbeatBatcher } from './coordinator.js';
import { Member } from './member.js';
import { Poller } from './poller.js';
import { Producer } from './producer.js';
import { connectRedis } from './redis.js';

export {
  Coordinator, CoordinatorAuthError, CoordinatorError, CoordinatorRejected, CoordinatorUnavailable, HeartbeatBatcher,
  MIN_PROTOCOL_VERSION, Negotiation,
} from './coordinator.js';
export { CLIENT, Member, MemberReplaced, CoordinatorUnintelligible } from './member.js';
export { MemberMachine, PROTOCOL_VERSION } from './machine.js';
export { Poller, monotonic } from './poller.js';
export { Producer, ProducerFenced, ProducerPaused, RedisOutOfMemory, ShardFull } from './producer.js';
export { connectRedis, createRedis, parseRedisUrl } from './redis.js';
export { jump, route, routingHash } from './routing.js';
export { SCRIPTS, runScript } from './scripts.js';
export { TRACEPARENT, TRACESTATE, enableTracing } from './tracing.js';
export { HANDLER_BUCKETS, WorkerMetrics } from './metrics.js';

/** @typedef {import('./poller.js').Message} Message */
/** @typedef {import('./poller.js').Handler} Handler */
/** @typedef {import('./poller.js').PollerSettings} PollerSettings */
/** @typedef {import('./machine.js').MemberSettings} MemberSettings */
/** @typedef {import('./producer.js').Fields} Fields */

/**
 * @typedef {object} WorkerOptions
 * @property {string | string[]} coordinatorUrl  one, several comma-separated, or an array
 * @property {string} [redisUrl]       redis://, rediss://, redis+sentinel:// (default redis://127.0.0.1:6379)
 * @property {any} [redis]             an ioredis client to use instead of redisUrl
 * @property {string} stream           the stream prefix
 * @property {string} group            the consumer group
 * @property {string} [token]          the member credential (Authorization: Bearer)
 * @property {string} [memberId]       default `<hostname>/<pid>`
 * @property {boolean} [static]        a static member (keeps its id across restarts)
 * @property {number} [concurrency]    handler calls in flight at most (default: the group's maxConcurrency)
 * @property {import('./poller.js').Handler} [handler]  without one, iterate the worker
 * @property {import('./poller.js').PollerSettings} [poller]
 * @property {(line: string) => void} [log]
 * @property {import('./metrics.js').WorkerMetrics} [metrics]  count this worker in these metrics
 *   (the per-shard lag and pending are then measured every `reclaimEveryMs`)
 */

/** @type {Map<string, {coordinator: Coordinator, batcher: HeartbeatBatcher}>} one per coordinator
 * URLs and credential in this process: the workers' heartbeats travel together */
const transports = new Map();

/** @param {string | string[]} urls @param {string} [token] */
function sharedTransport(urls, token) {
  const name = `${[urls].flat().join(',')} ${token ?? ''}`;
  let shared = transports.get(name);
  if (!shared) {
    const coordinator = new Coordinator({ urls, token });
    shared = { coordinator, batcher: new HeartbeatBatcher(coordinator) };
    transports.set(name, shared);
  }
  return shared;
}

/**
 * A worker: a member of `group` reading `stream`. `await worker.start()`, then `await worker.stop()`
 * to leave gracefully; `worker.done` settles when the member ends (rejects on 401/403, REPLACED...).
 * @param {WorkerOptions} options
 */
export function createWorker(options) {
  return new Worker(options);
}

export class Worker {
  /** @param {WorkerOptions} options */
  constructor(options) {
    if (!options.stream || !options.group) throw new Error('stream and group are required');
    this.options = options;
    this.log = options.log ?? ((/** @type {string} */ line) => process.stderr.write(line + '\n'));
    this.memberId = options.memberId || `${hostname()}/${process.pid}`;
    /** @type {{message: any, signal: AbortSignal, resolve: (v?: any) => void, reject: (e: any) => void}[]} */
    this._items = [];
    /** @type {((v?: any) => void)[]} */
    this._takers = [];
    this.handler = options.handler ?? ((message, ctx) => this.#offer(message, ctx));
    /** @type {Member|null} */
    this.member = null;
    /** @type {Poller|null} */
    this.poller = null;
    /** @type {Promise<void>} */
    this.done = new Promise((resolve, reject) => { this._settle = { resolve, reject }; });
    this.done.catch(() => {});
    this._ownsRedis = !options.redis;
  }

  /** Connect and join; resolves once the heartbeat loop runs. */
  async start() {
    const o = this.options;
    this._starting = true;
    this.redis = o.redis ?? (await connectRedis(o.redisUrl ?? 'redis://127.0.0.1:6379'));
    this.redis.on?.('error', () => {}); // failures surface on the calls, retried there
    const { coordinator, batcher } = sharedTransport(o.coordinatorUrl, o.token);
    this.poller = new Poller({
      redis: this.redis, group: o.group, memberId: this.memberId, incarnation: '', handler: this.handler,
      concurrency: o.concurrency, settings: o.poller, log: this.log, stream: o.stream, metrics: o.metrics,
    });
    if (o.metrics) {
      this.poller.measureLag = true;
      o.metrics.track(this);
    }
    this.member = new Member({
      coordinator, streamPrefix: o.stream, group: o.group, memberId: this.memberId, lifecycle: this.poller,
      static: o.static, log: this.log, transport: batcher,
    });
    this.poller.incarnation = this.member.incarnation;
    if (this._stopRequested) this.member.stop(); // stop() came while connecting
    this.member.run().then(
      async () => { await this.#close(); this._settle?.resolve(undefined); },
      async (err) => { await this.#close(); this._settle?.reject(err); },
    );
    return this;
  }

  /** Leave gracefully (revokes acknowledged, then epoch -1) and close. */
  async stop() {
    this._stopRequested = true;
    if (!this.member && !this._starting) {
      this._settle?.resolve(undefined); // never started
      return;
    }
    this.member?.stop();
    try {
      await this.done;
    } catch {
      // stop() resolves; `done` says what went wrong
    }
  }

  async #close() {
    await this.poller?.close();
    for (const item of this._items) item.reject(new Error('the worker stopped'));
    this._items = [];
    for (const take of this._takers) take(undefined);
    this._takers = [];
    this._closed = true;
    if (this._ownsRedis) this.redis?.disconnect();
  }

  // --- the iterator form: for await (const {message, signal} of worker) { ... } -------------
  // The entry is acknowledged when the loop body asks for the next one; a body that throws
  // ends the iteration (the entry stays pending: it is handled again).

  /** @param {any} message @param {{signal: AbortSignal}} ctx */
  #offer(message, { signal }) {
    return new Promise((resolve, reject) => {
      this._items.push({ message, signal, resolve, reject });
      this._takers.shift()?.(undefined);
    });
  }

  async *[Symbol.asyncIterator]() {
    /** @type {any} */
    let current = null;
    try {
      while (!this._closed) {
        if (current) { current.resolve(); current = null; }
        while (!this._items.length && !this._closed) await new Promise((r) => this._takers.push(r));
        if (this._closed) return;
        current = this._items.shift();
        if (current.signal.aborted) { current.reject(current.signal.reason); current = null; continue; }
        yield { message: current.message, signal: current.signal };
      }
    } finally {
      if (current) current.reject(new Error('the loop body did not finish'));
    }
  }
}

/**
 * @typedef {object} ProducerOptions
 * @property {string | string[]} coordinatorUrl
 * @property {string} [redisUrl]
 * @property {any} [redis]
 * @property {string} stream
 * @property {string} [token]     the producer credential
 * @property {string} [producerId]
 * @property {(line: string) => void} [log]
 */

/**
 * A producer; `await producer.start()` registers it (or the first publish does), then
 * `publish(key, fields)` / `publishMany([{key, fields}, ...])`; `close()` leaves.
 * @param {ProducerOptions} options
 */
export function createProducer(options) {
  const coordinator = new Coordinator({ urls: options.coordinatorUrl, token: options.token });
  const producer = new Producer({
    coordinator, redis: options.redis ?? null, stream: options.stream, producerId: options.producerId, log: options.log,
  });
  const ownsRedis = !options.redis;
  let started = /** @type {Promise<any>|null} */ (null);
  const ensure = () => {
    if (!started) {
      started = (async () => {
        if (!producer.redis) {
          producer.redis = await connectRedis(options.redisUrl ?? 'redis://127.0.0.1:6379');
          producer.redis.on?.('error', () => {});
        }
        await producer.start();
      })();
      started.catch(() => { started = null; });
    }
    return started;
  };
  return {
    producer,
    start: async () => { await ensure(); return producer; },
    /** @param {string | Uint8Array} key @param {import('./producer.js').Fields} fields */
    publish: async (key, fields) => { await ensure(); return producer.publish(key, fields); },
    /** @param {Parameters<Producer['publishMany']>[0]} messages */
    publishMany: async (messages) => { await ensure(); return producer.publishMany(messages); },
    close: async () => {
      await producer.close();
      if (ownsRedis) producer.redis?.disconnect();
    },
  };
}
