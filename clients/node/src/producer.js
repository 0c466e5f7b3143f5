// The producer: registers with the coordinator (POST /v1/producers/heartbeat) for the layout,
// routes with jump-v1 over the ACTIVE shards, appends through member/append.lua one call per
// shard; a SEALED refusal means the layout is stale: heartbeat, take the new layout, route
// those messages again (P1-P5). Idempotent (P6, feature level 6, on by default): the
// coordinator gives the process an epoch, each message keeps the sequence it got when its
// publish began, and a call whose answer was lost is sent again as it was, to the same shard,
// which answers a repeat with the ids it gave (REPEAT) instead of appending again.
import { hostname } from 'node:os';
import { CoordinatorAuthError, CoordinatorRejected, CoordinatorUnavailable } from './coordinator.js';
import { PROTOCOL_VERSION } from './machine.js';
import { CLIENT } from './member.js';
import { Router } from './routing.js';
import { appendKeys, runScript } from './scripts.js';
import { TRACEPARENT, sendSpan } from './tracing.js';

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

/** Another process registered this producer's id: this one is fenced and publishes nothing more. */
export class ProducerFenced extends Error {}

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
   *   idempotent?: boolean, log?: (line: string) => void}} o
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
    /** @type {import('./routing.js').Router|null} routes with `layout` (made again when it changes) */
    this.router = null;
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
    /** Idempotence (feature level 6): asked for, the epoch given (null: none yet or an older
     * coordinator), the next sequence, the first sequences of the publishes in flight. */
    this.idempotent = o.idempotent ?? true;
    /** @type {number|null} */
    this.epoch = null;
    this.nextSeq = 1;
    /** @type {Map<number, number>} */
    this.open = new Map();
    /** How long the shards keep this producer's records after its last append there (ms). */
    this.windowMs = Math.max(120_000, 2 * this.deliveryTimeoutMs);
    /** Calls Redis answered as repeats of an append already made (nothing appended again). */
    this.repeats = 0;
    this.noEpochLogged = false;
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
    if (this.idempotent) body.producerEpoch = this.epoch ?? 0;
    let answer;
    try {
      answer = await this.coordinator.post('/v1/producers/heartbeat', body);
    } catch (err) {
      if (err instanceof CoordinatorAuthError || err instanceof CoordinatorRejected) this.fatal = err;
      if (/** @type {any} */ (err)?.code === 'PRODUCER_FENCED') {
        this.fatal = new ProducerFenced(`producer ${this.producerId} is fenced: another process registered its id`);
      }
      throw err;
    }
    if (this.idempotent && typeof answer.producerEpoch === 'number') {
      this.epoch = answer.producerEpoch;
    } else if (this.idempotent && this.epoch === null && !this.noEpochLogged) {
      this.noEpochLogged = true;
      this.log(`producer ${this.producerId}: the coordinator gives no producer epoch (feature level below 6): publishing without idempotence`);
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
    return sendSpan(this.stream, messages.length, (carried) => this.#publish(messages, carried));
  }

  /**
   * @param {(Outgoing | [string | Uint8Array, Fields])[]} messages
   * @param {Record<string, string>} carried the send span's context, as entry fields
   * @returns {Promise<string[]>}
   */
  async #publish(messages, carried) {
    const items = messages.map((m) => (Array.isArray(m) ? { key: m[0], fields: m[1] } : m))
      .map((m) => (carried[TRACEPARENT] ? { key: m.key, fields: { ...m.fields, ...carried } } : m));
    /** @type {string[]} */
    const ids = new Array(items.length);
    await this.#untilOpen();
    this.inFlight++;
    const first = this.nextSeq;
    this.nextSeq += items.length;
    this.open.set(first, (this.open.get(first) ?? 0) + 1);
    const epoch = this.idempotent ? this.epoch : null;
    const giveUpAt = Date.now() + this.deliveryTimeoutMs;
    try {
      /** @type {{shardKey: string, idx: number[]}[]} calls not answered yet: sent again as they are */
      let calls = [];
      let toRoute = items.map((_, i) => i);
      for (let refresh = 0, waits = 0; calls.length || toRoute.length; ) {
        /** @type {Map<string, number[]>} */
        const byShard = new Map();
        if (!this.router || this.router.layout !== this.layout) this.router = new Router(this.layout);
        for (const i of toRoute) {
          const shard = /** @type {string} */ (this.router.shard(items[i].key).key);
          const list = byShard.get(shard) ?? [];
          list.push(i);
          byShard.set(shard, list);
        }
        calls = [...calls, ...[...byShard].map(([shardKey, idx]) => ({ shardKey, idx }))];
        toRoute = [];
        const low = Math.min(...this.open.keys());
        /** @type {typeof calls} */
        const again = [];
        /** @type {string|null} */
        let sealed = null;
        /** @type {string|null} */
        let full = null;
        /** @type {unknown} */
        let lost = null;
        await Promise.all(calls.map(async (call) => {
          const { shardKey, idx } = call;
          /** @type {(string|number|Buffer)[]} */
          const args = epoch === null ? ['', 0, 0, 0, idx.length] : [epoch, first + idx[0], low, this.windowMs, idx.length];
          for (const i of idx) {
            const flat = flatten(items[i].fields);
            args.push(flat.length, ...flat);
          }
          try {
            let reply = await runScript(this.redis, 'append', appendKeys(shardKey, this.producerId), args);
            if (reply[0] === 'REPEAT') {
              this.repeats++;
              reply = reply.slice(1);
            }
            idx.forEach((i, n) => { ids[i] = String(reply[n]); });
          } catch (err) {
            const text = err instanceof Error ? err.message : '';
            if (text.startsWith('SEALED')) {
              sealed = text;
              toRoute.push(...idx);
            } else if (/^(FULL|OOM)\b/.test(text)) {
              full = text;
              if (full.startsWith('FULL')) this.#noteFull(shardKey);
              again.push(call);
            } else if (text.startsWith('FENCED producer epoch')) {
              this.fatal = new ProducerFenced(`producer ${this.producerId} is fenced: ${text}`);
              throw this.fatal;
            } else if (err instanceof Error && err.name !== 'ReplyError') {
              lost = err; // no answer (the connection failed): sent again as it is
              again.push(call);
            } else {
              throw err;
            }
          }
        }));
        calls = again;
        toRoute.sort((a, b) => a - b);
        if (calls.length && !toRoute.length) {
          // full, out of memory or unanswered: room comes as groups consume, Redis comes back
          if (Date.now() >= giveUpAt) {
            const what = `publishing ${calls.reduce((n, c) => n + c.idx.length, 0)} message(s) to ${this.stream}: ${full ?? lost}`;
            if (full === null) throw new Error(`${what} (Redis did not answer)`);
            throw full.startsWith('OOM') ? new RedisOutOfMemory(what) : new ShardFull(what, full.split(' ')[1]);
          }
          if (full !== null) await this.#reportFull();
          await sleep(Math.min(1000, 50 * 2 ** Math.min(waits++, 5)) * (0.5 + Math.random() * 0.5));
        } else if (toRoute.length) {
          if (refresh >= this.maxRefreshes) throw new Error(`still refused after ${refresh} layout refreshes: ${sealed}`);
          refresh++;
          const before = this.metadataVersion;
          await this.#refresh();
          if (this.metadataVersion === before) await sleep(Math.min(1000, 100 * 2 ** refresh));
        }
      }
    } finally {
      this.inFlight--;
      const left = (this.open.get(first) ?? 1) - 1;
      if (left > 0) this.open.set(first, left); else this.open.delete(first);
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
