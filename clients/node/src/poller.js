// The poller: reads the shards a member owns through the fenced scripts and hands their entries
// to the handler. One runner per shard (claim its backlog, then read.lua; one handler call at a
// time, in id order; ack.lua after each call), a shared limit of calls in flight, and the
// exclusive-handling rule checked immediately before every handler start: the shard is still
// held (not stopped by a revoke or a loss) and the lease is valid now (M5, M10).
import { isTransient } from './redis.js';
import { deadLetterKey, isFenced, ownersKey, runScript } from './scripts.js';
import { consumerSpan, joinTrace, splitTrace } from './tracing.js';

/** Monotonic seconds (CLOCK_MONOTONIC on Linux). */
export const monotonic = () => Number(process.hrtime.bigint()) / 1e9;

/**
 * @typedef {object} Message
 * @property {string} id          the stream entry id
 * @property {number} shard       the shard index
 * @property {string} key         the shard's stream key
 * @property {Record<string,string>} fields
 * @property {number} deliveries  1 the first time
 * @property {string} memberId
 */
/** @typedef {(message: Message, context: {signal: AbortSignal}) => Promise<unknown> | unknown} Handler */

/**
 * @typedef {object} PollerSettings
 * @property {number} [batch]            entries per read (50)
 * @property {number} [maxDeliveries]    past this many deliveries an entry is dead-lettered (5)
 * @property {number} [retryAfterMs]     a failed entry is handled again this much later (1000)
 * @property {number} [reclaimEveryMs]   how often to look for entries idle under any consumer (5000)
 * @property {number} [reclaimIdleMs]    what counts as idle (30000)
 * @property {number} [idleMinMs]        the first pause after a read found nothing (10)
 * @property {number} [idleMaxMs]        the longest such pause (100)
 */

const sleep = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

/** @param {string[]|null|undefined} flat */
function toFields(flat) {
  /** @type {Record<string,string>} */
  const out = {};
  if (!flat) return out;
  for (let i = 0; i + 1 < flat.length; i += 2) out[String(flat[i])] = String(flat[i + 1]);
  return out;
}

class Slots {
  /** @param {number} size */
  constructor(size) {
    this.size = Math.max(1, size);
    this.used = 0;
    /** @type {{resolve: (ok: boolean) => void, owner: any}[]} */
    this.waiters = [];
  }
  /** @param {any} owner @returns {Promise<boolean>} */
  acquire(owner) {
    if (this.used < this.size) {
      this.used++;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => this.waiters.push({ resolve, owner }));
  }
  release() {
    this.used--;
    this.#grant();
  }
  /** @param {number} size */
  resize(size) {
    this.size = Math.max(1, size);
    this.#grant();
  }
  /** A waiter that no longer wants a slot gets `false`. @param {any} owner */
  cancel(owner) {
    this.waiters = this.waiters.filter((w) => (w.owner === owner ? (w.resolve(false), false) : true));
  }
  #grant() {
    while (this.used < this.size && this.waiters.length) {
      this.used++;
      /** @type {any} */ (this.waiters.shift()).resolve(true);
    }
  }
}

class ShardRun {
  /** @param {number} index @param {string} key @param {boolean} draining */
  constructor(index, key, draining) {
    this.index = index;
    this.key = key;
    this.owners = ownersKey(key);
    this.draining = draining;
    this.stopped = false;
    this.lost = false;
    /** @type {number} after a revoke: acknowledgements are given up past this time */
    this.stopDeadline = Infinity;
    /** @type {(Message & {redelivered: boolean, notBefore: number})[]} */
    this.queue = [];
    this.claiming = true;
    this.claimCursor = '0-0';
    this.lastRead = '0-0';
    this.tail = '';
    this.nextReclaim = 0;
    /** @type {string|null} why it cannot be read (reported in stalledShards) */
    this.troubled = null;
    /** @type {AbortController|null} the handler call in flight */
    this.controller = null;
    /** @type {(() => void)|null} */
    this._wake = null;
    /** @type {Promise<void>} */
    this.done = Promise.resolve();
    this.failures = 0;
  }
  wake() {
    const w = this._wake;
    this._wake = null;
    if (w) w();
  }
  /** An interruptible pause. @param {number} ms */
  pause(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(() => { this._wake = null; resolve(undefined); }, Math.max(0, ms));
      this._wake = () => { clearTimeout(timer); resolve(undefined); };
    });
  }
}

export class Poller {
  /**
   * @param {{redis: any, group: string, memberId: string, incarnation: string, handler: Handler,
   *   concurrency?: number, settings?: PollerSettings, log?: (line: string) => void, stream?: string}} o
   */
  constructor({ redis, group, memberId, incarnation, handler, concurrency, settings = {}, log, stream = '' }) {
    this.redis = redis;
    this.group = group;
    /** The stream prefix (the destination name of trace spans). */
    this.stream = stream;
    this.memberId = memberId;
    this.incarnation = incarnation;
    this.handler = handler;
    this.settings = {
      batch: 50, maxDeliveries: 5, retryAfterMs: 1000, reclaimEveryMs: 5000, reclaimIdleMs: 30_000,
      idleMinMs: 10, idleMaxMs: 100, ...settings,
    };
    /** A concurrency the application fixed (else the coordinator's maxConcurrency). */
    this.fixedConcurrency = concurrency;
    this.slots = new Slots(concurrency ?? 1);
    this.log = log ?? ((line) => process.stderr.write(line + '\n'));
    /** @type {Map<number, ShardRun>} */
    this.shards = new Map();
    /** @type {Map<number, Promise<void>>} runners still ending (a loss), per index */
    this.ending = new Map();
    /** Handler calls may start before this (monotonic seconds). */
    this.leaseUntil = -Infinity;
    /** @type {NodeJS.Timeout|null} */
    this.leaseTimer = null;
    this.handled = 0;
    this.failed = 0;
    this.deadLettered = 0;
    this.closed = false;
  }

  leaseValid() {
    return monotonic() < this.leaseUntil;
  }

  // --- lifecycle (what the member's steps say) ------------------------------

  /** What it holds is its own until `until` (monotonic seconds). @param {number} until */
  renewed(until) {
    this.leaseUntil = until;
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    this.leaseTimer = null;
    const left = (until - monotonic()) * 1000;
    if (left <= 0) {
      this.#abortAll('the lease ended');
    } else if (Number.isFinite(left)) {
      this.leaseTimer = setTimeout(() => {
        if (!this.leaseValid()) this.#abortAll('the lease ended');
      }, left + 1);
      this.leaseTimer.unref?.();
      for (const shard of this.shards.values()) shard.wake();
    }
  }

  /** @param {number} workers */
  setConcurrency(workers) {
    if (this.fixedConcurrency === undefined) this.slots.resize(workers);
  }

  /** Start reading these shards (their backlog first). @param {Iterable<number>} indexes @param {any} layout */
  assigned(indexes, layout) {
    const byIndex = new Map((layout?.shards ?? []).map((/** @type {any} */ s) => [s.index, s]));
    for (const index of indexes) {
      const spec = byIndex.get(index);
      if (!spec) {
        this.log(`${this.memberId}: shard ${index} is not in the layout; not read`);
        continue;
      }
      const old = this.shards.get(index);
      if (old) this.#stopShard(old, true);
      const shard = new ShardRun(index, spec.key, spec.state === 'DRAINING');
      this.shards.set(index, shard);
      const before = Promise.all([old?.done, this.ending.get(index)]);
      shard.done = before.then(() => this.#run(shard)).catch((err) => {
        this.log(`${this.memberId}: shard ${index} runner failed: ${err?.stack ?? err}`);
      });
    }
  }

  /**
   * Stop starting handlers on these shards, let the calls in flight end (aborted past
   * `withinS`), flush their acknowledgements, forget them.
   * @param {Iterable<number>} indexes @param {number} withinS
   */
  async revoke(indexes, withinS) {
    const gone = [...indexes].map((i) => this.shards.get(i)).filter((s) => s !== undefined);
    const deadline = monotonic() + withinS;
    for (const shard of gone) {
      shard.stopDeadline = deadline + 1;
      this.#stopShard(shard, false);
    }
    /** @type {NodeJS.Timeout|undefined} */
    let timer;
    const overran = new Promise((resolve) => { timer = setTimeout(resolve, withinS * 1000, 'timeout'); });
    const result = await Promise.race([Promise.all(gone.map((s) => s.done)), overran]);
    clearTimeout(timer);
    if (result === 'timeout') {
      for (const shard of gone) shard.controller?.abort(new Error('revoked: the revoke timeout is near'));
    }
    // A handler that ignores its signal still holds the shard: the revoke waits for it.
    await Promise.all(gone.map((s) => s.done));
    for (const shard of gone) if (this.shards.get(shard.index) === shard) this.shards.delete(shard.index);
  }

  /** Stop at once: abort in-flight calls, no acknowledgement (someone else owns them now).
   * @param {Iterable<number>} indexes */
  lost(indexes) {
    for (const index of indexes) {
      const shard = this.shards.get(index);
      if (!shard) continue;
      this.shards.delete(index);
      this.#stopShard(shard, true);
      const ending = shard.done.then(() => {
        if (this.ending.get(index) === ending) this.ending.delete(index);
      });
      this.ending.set(index, ending);
    }
  }

  /** Shards it holds but cannot read (the scripts refuse them: owner token or group gone). */
  stalledShards() {
    return new Set([...this.shards.values()].filter((s) => s.troubled && !s.stopped).map((s) => s.index));
  }

  /** Everything stops (after the member left). */
  async close() {
    this.closed = true;
    this.lost([...this.shards.keys()]);
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    await Promise.all(this.ending.values());
  }

  // --- internals ------------------------------------------------------------

  /** @param {ShardRun} shard @param {boolean} lost */
  #stopShard(shard, lost) {
    shard.stopped = true;
    if (lost) {
      shard.lost = true;
      shard.controller?.abort(new Error('the shard was lost'));
    }
    this.slots.cancel(shard);
    shard.wake();
  }

  /** @param {string} why */
  #abortAll(why) {
    for (const shard of this.shards.values()) shard.controller?.abort(new Error(why));
  }

  /** @param {ShardRun} shard */
  async #run(shard) {
    const s = this.settings;
    let idle = s.idleMinMs;
    while (!shard.stopped) {
      if (!this.leaseValid()) {
        // After a pause nothing is read or started until a heartbeat confirms the lease.
        await shard.pause(200);
        continue;
      }
      if (shard.queue.length === 0) {
        try {
          const got = await this.#fetch(shard);
          if (shard.troubled) {
            this.log(`${this.memberId}: shard ${shard.index} readable again`);
            shard.troubled = null;
          }
          shard.failures = 0;
          if (got) {
            idle = s.idleMinMs;
          } else {
            await shard.pause(idle);
            idle = Math.min(idle * 2, s.idleMaxMs);
          }
        } catch (err) {
          await this.#trouble(shard, err, 'reading');
        }
        continue;
      }
      const head = shard.queue[0];
      const wait = head.notBefore - Date.now();
      if (wait > 0) {
        await shard.pause(wait);
        continue;
      }
      if (!(await this.slots.acquire(shard))) continue; // stopped while waiting
      try {
        if (shard.stopped || !this.leaseValid()) continue;
        await this.#handle(shard, /** @type {any} */ (shard.queue.shift()));
      } catch (err) {
        await this.#trouble(shard, err, 'handling');
      } finally {
        this.slots.release();
      }
    }
  }

  /**
   * @param {ShardRun} shard @param {unknown} err @param {string} doing
   */
  async #trouble(shard, err, doing) {
    if (shard.stopped) return;
    const text = err instanceof Error ? err.message : String(err);
    if (isFenced(err)) {
      if (!shard.troubled) {
        this.log(`${this.memberId}: shard ${shard.index} (${shard.key}) refused: ${text}; ` +
          'telling the coordinator (stalledShards), which restores it or takes it away');
      }
      shard.troubled = text;
      await shard.pause(500);
      return;
    }
    shard.failures += 1;
    if (shard.failures === 1 || shard.failures % 20 === 0) {
      this.log(`${this.memberId}: Redis failed while ${doing} shard ${shard.index}: ${text}`);
    }
    if (!isTransient(err) && /^NOGROUP|no such key/i.test(text)) shard.troubled = text;
    await shard.pause(Math.min(2000, 50 * 2 ** Math.min(shard.failures, 6)) * (0.5 + Math.random() * 0.5));
  }

  /** Fill the shard's queue: its backlog first, then new entries; reclaim idle ones now and then.
   * @param {ShardRun} shard @returns {Promise<boolean>} whether anything came */
  async #fetch(shard) {
    const s = this.settings;
    if (shard.claiming) {
      const reply = await runScript(this.redis, 'claim', [shard.key, shard.owners],
        [this.group, this.memberId, this.incarnation, this.memberId, 0, s.batch, shard.claimCursor]);
      const [cursor, entries] = reply;
      shard.claimCursor = String(cursor);
      if (shard.claimCursor === '0-0') shard.claiming = false;
      this.#enqueueClaimed(shard, entries);
      return true;
    }
    const now = Date.now();
    if (now >= shard.nextReclaim) {
      shard.nextReclaim = now + s.reclaimEveryMs;
      if (shard.nextReclaim && shard.lastRead !== '0-0') {
        const entries = await runScript(this.redis, 'reclaim', [shard.key, shard.owners],
          [this.group, this.memberId, this.incarnation, this.memberId, s.reclaimIdleMs, s.batch]);
        if (entries && entries.length) {
          this.#enqueueClaimed(shard, entries);
          return true;
        }
      }
    }
    const reply = await runScript(this.redis, 'read', [shard.key, shard.owners],
      [this.group, this.memberId, this.incarnation, this.memberId, s.batch, shard.lastRead, shard.tail]);
    const [refused, entries, tail] = reply[0];
    if (refused) {
      const err = new Error(String(refused));
      err.name = 'ShardRefused';
      throw err;
    }
    shard.tail = tail ? String(tail) : '';
    for (const [id, flat] of entries ?? []) {
      shard.lastRead = String(id);
      shard.queue.push(this.#message(shard, String(id), flat, 1, false));
    }
    return (entries ?? []).length > 0;
  }

  /** @param {ShardRun} shard @param {any[]} entries */
  #enqueueClaimed(shard, entries) {
    const held = new Set(shard.queue.map((m) => m.id));
    for (const [id, flat, deliveries] of entries ?? []) {
      if (!flat || held.has(String(id))) continue; // deleted since, or already queued here
      shard.queue.push(this.#message(shard, String(id), flat, Number(deliveries) || 1, true));
    }
    shard.queue.sort((a, b) => compareIds(a.id, b.id));
  }

  /** @param {ShardRun} shard @param {string} id @param {any} flat @param {number} deliveries @param {boolean} redelivered */
  #message(shard, id, flat, deliveries, redelivered) {
    return {
      id, shard: shard.index, key: shard.key, fields: toFields(flat), deliveries, memberId: this.memberId,
      redelivered, notBefore: 0,
    };
  }

  /** One entry: count a redelivery, dead-letter past maxDeliveries, the handler, the ack.
   * @param {ShardRun} shard @param {Message & {redelivered: boolean, notBefore: number}} message */
  async #handle(shard, message) {
    const s = this.settings;
    if (message.redelivered) {
      let deliveries;
      try {
        deliveries = Number(await runScript(this.redis, 'start', [shard.key, shard.owners],
          [this.group, this.memberId, this.incarnation, this.memberId, message.id]));
      } catch (err) {
        shard.queue.unshift(message);
        throw err;
      }
      if (!deliveries) return; // no longer pending here (acknowledged, or claimed by another)
      message = { ...message, deliveries, redelivered: false };
      // The Redis call took time: the rule again, immediately before the start.
      if (shard.stopped || !this.leaseValid()) {
        shard.queue.unshift({ ...message, redelivered: true });
        return;
      }
    }
    // the publisher's trace context, taken out of the fields (kept on the message for its retries)
    const [fields, split] = splitTrace(message.fields);
    if (split.traceparent) message = { ...message, fields, trace: split };
    const trace = /** @type {any} */ (message).trace || {};
    const where = { stream: this.stream, group: this.group, shard: shard.index, id: message.id,
      deliveries: message.deliveries, trace };
    if (message.deliveries > s.maxDeliveries) {
      try {
        const full = { ...message, fields: joinTrace(message.fields, trace) }; // its trace fields go with it
        await consumerSpan('settle', { ...where, settle: 'dead_letter' }, () => this.#deadLetter(shard, full));
      } catch (err) {
        if (!shard.stopped) shard.queue.unshift({ ...message, redelivered: true });
        throw err;
      }
      return;
    }
    const controller = new AbortController();
    shard.controller = controller;
    const { redelivered: _r, notBefore: _n, trace: _t, ...visible } = /** @type {any} */ (message);
    let ok = false;
    try {
      await consumerSpan('process', where, () => this.handler(visible, { signal: controller.signal }));
      ok = true;
    } catch (err) {
      if (!controller.signal.aborted && !shard.lost) {
        this.failed += 1;
        this.log(`${this.memberId}: handler failed on ${shard.key} ${message.id} (delivery ` +
          `${message.deliveries} of ${s.maxDeliveries}): ${err instanceof Error ? err.message : err}`);
        // It stays pending in Redis; handled again later (first: the shard's order holds).
        shard.queue.unshift({ ...message, deliveries: message.deliveries + 1, redelivered: true,
          notBefore: Date.now() + s.retryAfterMs });
        return;
      }
    } finally {
      shard.controller = null;
    }
    if (!ok) {
      // Aborted (lost, the lease ended, or past the revoke timeout): not acknowledged; it stays
      // pending for whoever owns the shard next (or this member again).
      if (!shard.stopped) shard.queue.unshift({ ...message, redelivered: true });
      return;
    }
    this.handled += 1;
    await this.#ack(shard, message.id);
  }

  /** @param {ShardRun} shard @param {string} id */
  async #ack(shard, id) {
    for (let attempt = 0; !shard.lost; attempt++) {
      try {
        const [reply] = await runScript(this.redis, 'ack', [shard.key, shard.owners],
          [this.group, this.memberId, this.incarnation, 1, id]);
        if (typeof reply === 'string') throw Object.assign(new Error(reply), { name: 'AckRefused' });
        return;
      } catch (err) {
        if (isFenced(err)) {
          // Not ours (any more, or Redis lost the token): the next owner handles it again.
          shard.troubled = err instanceof Error ? err.message : String(err);
          this.log(`${this.memberId}: acknowledgement of ${shard.key} ${id} refused: ${shard.troubled}`);
          return;
        }
        if (monotonic() > shard.stopDeadline) {
          this.log(`${this.memberId}: gave up acknowledging ${shard.key} ${id}: ${err}`);
          return;
        }
        if (attempt === 0) this.log(`${this.memberId}: acknowledging ${shard.key} ${id} failed: ${err}; retrying`);
        await sleep(Math.min(2000, 50 * 2 ** Math.min(attempt, 6)) * (0.5 + Math.random() * 0.5));
      }
    }
  }

  /** @param {ShardRun} shard @param {Message} message */
  async #deadLetter(shard, message) {
    const flat = Object.entries(message.fields).flat();
    await runScript(this.redis, 'dead_letter', [shard.key, shard.owners, deadLetterKey(shard.key)],
      [this.group, this.memberId, this.incarnation, message.id, message.deliveries - 1, ...flat]);
    this.deadLettered += 1;
    this.log(`${this.memberId}: dead-lettered ${shard.key} ${message.id} after ` +
      `${message.deliveries - 1} failed deliveries to ${deadLetterKey(shard.key)}`);
  }
}

/** Stream ids in order. @param {string} a @param {string} b */
export function compareIds(a, b) {
  const [am, as = '0'] = a.split('-');
  const [bm, bs = '0'] = b.split('-');
  const x = BigInt(am) - BigInt(bm) || BigInt(as) - BigInt(bs);
  return x < 0n ? -1 : x > 0n ? 1 : 0;
}
