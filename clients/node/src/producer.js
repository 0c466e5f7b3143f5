// The producer: registers with the coordinator (POST /v1/producers/heartbeat) for the layout,
// routes with jump-v1 over the ACTIVE shards, appends through member/append.lua one call per
// shard; a SEALED refusal means the layout is stale: heartbeat, take the new layout, route
// those messages again (P1-P5).
import { hostname } from 'node:os';
import { CoordinatorAuthError, CoordinatorRejected, CoordinatorUnavailable } from './coordinator.js';
import { PROTOCOL_VERSION } from './machine.js';
import { CLIENT } from './member.js';
import { route } from './routing.js';
import { appendKeys, runScript } from './scripts.js';

/** The stream stayed paused past the producer's pause timeout. */
export class ProducerPaused extends Error {}

/** Redis refused the messages with OOM (used memory above maxmemory) for deliveryTimeoutMs. */
export class RedisOutOfMemory extends Error {}

/** A shard stayed at its entry cap (retention `whenFull: refuse`) for deliveryTimeoutMs; `shard`
 * names its key. The messages routed there were not written. */
export class ShardFull extends Error {
  /** @param {string} message @param {string} shard */
  constructor(message, shard) {
    super(message);
    this.shard = shard;
  }
}

/** @typedef {Record<string, string | number | Buffer>} Fields */
/** @typedef {{key: string | Uint8Array, fields: Fields}} Outgoing */

const sleep = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

/** @param {Fields} fields */
function flatten(fields) {
  const out = [];
  for (const [k, v] of Object.entries(fields)) out.push(k, Buffer.isBuffer(v) ? v : String(v));
  if (!out.length) throw new Error('a message needs at least one field');
  return out;
}

export class Producer {
  /**
   * @param {{coordinator: import('./coordinator.js').Coordinator, redis: any, stream: string,
   *   producerId?: string, pauseTimeoutMs?: number, maxRefreshes?: number, deliveryTimeoutMs?: number,
   *   log?: (line: string) => void}} o
   */
  constructor(o) {
    this.coordinator = o.coordinator;
    this.redis = o.redis;
    this.stream = o.stream;
    this.producerId = o.producerId ?? `${hostname()}/${process.pid}/producer`;
    this.pauseTimeoutMs = o.pauseTimeoutMs ?? 60_000;
    this.maxRefreshes = o.maxRefreshes ?? 5;
    /** How long a publish keeps trying a full shard (retention's cap) before ShardFull. */
    this.deliveryTimeoutMs = o.deliveryTimeoutMs ?? 120_000;
    this.log = o.log ?? ((line) => process.stderr.write(line + '\n'));
    /** @type {any} */
    this.layout = null;
    this.metadataVersion = 0;
    this.paused = false;
    this.intervalMs = 3000;
    this.inFlight = 0;
    /** @type {Error|null} a refusal for good (401/403...) */
    this.fatal = null;
    this.closed = false;
    /** @type {NodeJS.Timeout|null} */
    this.timer = null;
    /** @type {Promise<void>|null} */
    this.beating = null;
    /** @type {Set<number>} shard indexes that refused appends as full, for the next heartbeat */
    this.fullShards = new Set();
    this.fullReportedAt = 0;
  }

  /** Register (the first heartbeat) and keep heartbeating in the background. */
  async start() {
    await this.heartbeat();
    this.#schedule();
    return this;
  }

  #schedule() {
    if (this.closed || this.fatal) return;
    this.timer = setTimeout(async () => {
      try {
        await this.heartbeat();
      } catch (err) {
        if (!this.fatal) this.log(`producer ${this.producerId}: heartbeat failed: ${err instanceof Error ? err.message : err}`);
      }
      this.#schedule();
    }, this.intervalMs);
    this.timer.unref?.();
  }

  /** One heartbeat (concurrent callers share it). */
  heartbeat() {
    if (!this.beating) this.beating = this.#beat().finally(() => { this.beating = null; });
    return this.beating;
  }

  /** @param {boolean} [leave] */
  async #beat(leave = false) {
    /** @type {Record<string, any>} */
    const body = {
      protocolVersion: PROTOCOL_VERSION, streamPrefix: this.stream, producerId: this.producerId,
      metadataVersion: this.metadataVersion, client: CLIENT,
    };
    if (this.paused && this.inFlight === 0) body.quiesced = true;
    if (leave) body.leave = true;
    // full shards (feature level 5): the coordinator trims them early; older ones ignore it
    const reported = [...this.fullShards];
    if (reported.length) body.fullShards = reported;
    let answer;
    try {
      answer = await this.coordinator.post('/v1/producers/heartbeat', body);
    } catch (err) {
      if (err instanceof CoordinatorAuthError || err instanceof CoordinatorRejected) this.fatal = err;
      throw err;
    }
    for (const index of reported) this.fullShards.delete(index);
    if (answer.layout) this.layout = answer.layout;
    if (typeof answer.metadataVersion === 'number' && this.layout?.metadataVersion === answer.metadataVersion) {
      this.metadataVersion = answer.metadataVersion;
    }
    if (answer.routing && answer.routing !== 'jump-v1') {
      throw new Error(`unsupported routing ${answer.routing}`);
    }
    this.paused = Boolean(answer.paused);
    if (answer.heartbeatIntervalMs > 0) this.intervalMs = answer.heartbeatIntervalMs;
  }

  /**
   * Publish one message; its entry id.
   * @param {string | Uint8Array} key @param {Fields} fields @returns {Promise<string>}
   */
  async publish(key, fields) {
    return (await this.publishMany([{ key, fields }]))[0];
  }

  /**
   * Publish several messages (one append.lua call per shard); their entry ids, in order.
   * @param {(Outgoing | [string | Uint8Array, Fields])[]} messages @returns {Promise<string[]>}
   */
  async publishMany(messages) {
    const items = messages.map((m) => (Array.isArray(m) ? { key: m[0], fields: m[1] } : m));
    /** @type {string[]} */
    const ids = new Array(items.length);
    let todo = items.map((_, i) => i);
    await this.#untilOpen();
    this.inFlight++;
    const giveUpAt = Date.now() + this.deliveryTimeoutMs;
    try {
      for (let refresh = 0, waits = 0; todo.length; ) {
        /** @type {Map<string, number[]>} */
        const byShard = new Map();
        for (const i of todo) {
          const shard = route(this.layout, items[i].key);
          const list = byShard.get(shard.key) ?? [];
          list.push(i);
          byShard.set(/** @type {string} */ (shard.key), list);
        }
        /** @type {number[]} */
        const again = [];
        /** @type {string|null} */
        let sealed = null;
        /** @type {string|null} */
        let full = null;
        await Promise.all([...byShard].map(async ([shardKey, idx]) => {
          // no producer epoch: not idempotent (feature level 6 is the Python clients' so far)
          const args = ['', 0, 0, 0, idx.length];
          for (const i of idx) {
            const flat = flatten(items[i].fields);
            args.push(flat.length, ...flat);
          }
          try {
            const reply = await runScript(this.redis, 'append', appendKeys(shardKey, this.producerId), args);
            idx.forEach((i, n) => { ids[i] = String(reply[n]); });
          } catch (err) {
            if (err instanceof Error && err.message.startsWith('SEALED')) {
              sealed = err.message;
              again.push(...idx);
            } else if (err instanceof Error && /^(FULL|OOM)\b/.test(err.message)) {
              full = err.message;
              if (full.startsWith('FULL')) this.#noteFull(shardKey);
              again.push(...idx);
            } else {
              throw err;
            }
          }
        }));
        todo = again.sort((a, b) => a - b);
        if (todo.length && !sealed && full) {
          // the shard is at its cap: room comes as the groups consume and retention trims
          if (Date.now() >= giveUpAt) {
            const what = `publishing ${todo.length} message(s) to ${this.stream}: ${full}`;
            throw full.startsWith('OOM') ? new RedisOutOfMemory(what) : new ShardFull(what, full.split(' ')[1]);
          }
          await this.#reportFull();
          await sleep(Math.min(1000, 50 * 2 ** Math.min(waits++, 5)) * (0.5 + Math.random() * 0.5));
        } else if (todo.length) {
          if (refresh >= this.maxRefreshes) throw new Error(`still refused after ${refresh} layout refreshes: ${sealed}`);
          refresh++;
          const before = this.metadataVersion;
          await this.#refresh();
          if (this.metadataVersion === before) await sleep(Math.min(1000, 100 * 2 ** refresh));
        }
      }
    } finally {
      this.inFlight--;
    }
    return ids;
  }

  /** @param {string} shardKey a shard that refused appends as full */
  #noteFull(shardKey) {
    const shard = this.layout?.shards?.find((/** @type {any} */ s) => s.key === shardKey);
    if (shard) this.fullShards.add(shard.index);
  }

  /** Report full shards now (a heartbeat, at most one every 500 ms): the coordinator trims them early. */
  async #reportFull() {
    if (!this.fullShards.size || Date.now() - this.fullReportedAt < 500) return;
    this.fullReportedAt = Date.now();
    try {
      await this.heartbeat();
    } catch (err) {
      if (this.fatal) throw err;
    }
  }

  async #refresh() {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.heartbeat();
        return;
      } catch (err) {
        if (this.fatal || attempt >= 10 || !(err instanceof CoordinatorUnavailable)) throw err;
        await sleep(Math.min(2000, 100 * 2 ** attempt) * (0.5 + Math.random() * 0.5));
      }
    }
  }

  /** Wait while the stream is paused (P4), at most pauseTimeoutMs. */
  async #untilOpen() {
    if (this.fatal) throw this.fatal;
    if (this.closed) throw new Error('the producer is closed');
    if (!this.layout) await this.#refresh();
    const until = Date.now() + this.pauseTimeoutMs;
    while (this.paused) {
      if (Date.now() > until) throw new ProducerPaused(`stream ${this.stream} stayed paused for ${this.pauseTimeoutMs} ms`);
      await sleep(this.intervalMs);
      await this.#refresh();
    }
  }

  /** Stop heartbeating and tell the coordinator (leave). */
  async close() {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    try {
      await this.beating;
      await this.#beat(true);
    } catch {
      // the lease ends it
    }
  }
}
