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
 * @property {number} [batch]            entries per read of a shard (50)
 * @property {number} [maxDeliveries]    past this many deliveries an entry is dead-lettered (5)
 * @property {number} [retryAfterMs]     a failed entry is handled again this much later (1000)
 * @property {number} [reclaimEveryMs]   how often to look for entries idle under any consumer (5000)
 * @property {number} [reclaimIdleMs]    what counts as idle (30000)
 * @property {number} [wakeBlockMs]      how long one wake-up read (XREAD BLOCK) waits in Redis (10000)
 * @property {number} [idleSleepMs]      only where Redis refuses XREAD: the first pause of the
 *                                       polling fallback, doubling up to 200 ms (50)
 */

/** After Redis refused a wake-up read (an ACL without XREAD, a proxy without blocking commands),
 * the shards it names are polled for this long before blocking is tried again. */
export const POLL_FALLBACK_MS = 60_000;
/** The longest pause between two polls of that fallback. */
export const POLL_MAX_MS = 200;
/** A wake-up read that has not returned this long after its block ended is given up (its
 * connection closed): a connection that died without a reset never holds the shards. */
export const WAKE_GRACE_MS = 5_000;
/** Acknowledgements per ack.lua call at most. */
export const ACK_CHUNK = 1_000;

const sleep = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

/** @param {string[]|null|undefined} flat */
function toFields(flat) {
  /** @type {Record<string,string>} */
  const out = {};
  if (!flat) return out;
  for (let i = 0; i + 1 < flat.length; i += 2) out[String(flat[i])] = String(flat[i + 1]);
  return out;
}

/** CRC16/XMODEM, as Redis Cluster hashes keys. @param {Buffer} data */
function crc16(data) {
  let crc = 0;
  for (const byte of data) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

/** The hash slot of a key (its `{tag}` when it has a non-empty one). @param {string} key */
export function keySlot(key) {
  const open = key.indexOf('{');
  if (open >= 0) {
    const close = key.indexOf('}', open + 1);
    if (close > open + 1) key = key.slice(open + 1, close);
  }
  return crc16(Buffer.from(key)) % 16384;
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

/** Something to wait for and to be woken from, without losing a wake that came first. */
class Signal {
  constructor() {
    this.set = false;
    /** @type {(() => void)|null} */
    this._wake = null;
  }
  notify() {
    this.set = true;
    const w = this._wake;
    this._wake = null;
    if (w) w();
  }
  /** Until notified (at once if it was since the last wait), or `ms` passed. @param {number} [ms] */
  wait(ms = Infinity) {
    if (this.set) {
      this.set = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      /** @type {NodeJS.Timeout|undefined} */
      let timer;
      if (Number.isFinite(ms)) {
        timer = setTimeout(() => { this._wake = null; resolve(undefined); }, Math.max(0, ms));
      }
      this._wake = () => { clearTimeout(timer); this.set = false; resolve(undefined); };
    });
  }
}

/**
 * Where a shard's reading stands: `claiming` its backlog (entries earlier owners read but never
 * acknowledged), `reading` (entries may wait: the reader reads it when its queue has room), or
 * `caughtUp` (its last read returned the key's last id, `tail`: a wake-up read watches it).
 * @typedef {'claiming'|'reading'|'caughtUp'} ReadState
 */

class ShardRun {
  /** @param {number} index @param {string} key @param {boolean} draining @param {number} bundle */
  constructor(index, key, draining, bundle) {
    this.index = index;
    this.key = key;
    this.owners = ownersKey(key);
    this.draining = draining;
    this.bundle = bundle;
    this.stopped = false;
    this.lost = false;
    /** @type {number} after a revoke: acknowledgements are given up past this time */
    this.stopDeadline = Infinity;
    /** @type {(Message & {redelivered: boolean, notBefore: number})[]} */
    this.queue = [];
    /** @type {ReadState} */
    this.state = 'claiming';
    this.claimCursor = '0-0';
    this.lastRead = '0-0';
    this.tail = '';
    /** No read before this (Date.now() ms): a failed read backs off. */
    this.retryAt = 0;
    /** @type {string|null} why it cannot be read (reported in stalledShards) */
    this.troubled = null;
    /** @type {AbortController|null} the handler call in flight */
    this.controller = null;
    this.signal = new Signal();
    /** @type {Promise<void>} */
    this.done = Promise.resolve();
    this.failures = 0;
    /** @type {Set<Promise<void>>} acknowledgements in flight */
    this.acks = new Set();
  }
  wake() {
    this.signal.notify();
  }
  /** An interruptible pause (Infinity: until woken). @param {number} ms */
  pause(ms) {
    return this.signal.wait(ms);
  }
}

/** The wake-up read of a bundle of shards one XREAD may name: all of a member's shards on a
 * standalone Redis, one hash slot's on a cluster. */
class Watch {
  /** @param {number} bundle */
  constructor(bundle) {
    this.bundle = bundle;
    /** @type {Map<number, ShardRun>} */
    this.shards = new Map();
    this.changed = new Signal();
    /** @type {any} its own connection (a blocked read holds it), while one is open */
    this.connection = null;
    /** @type {Set<number>|null} the shards the XREAD in flight names */
    this.blockedOn = null;
    /** The XREAD in flight was ended on purpose (its connection closed). */
    this.cancelled = false;
    this.closed = false;
    /** Polling instead of blocking until then (Date.now() ms): Redis refused XREAD. */
    this.pollUntil = 0;
    this.pollSleep = 0;
    /** @type {Promise<void>} */
    this.done = Promise.resolve();
  }
}

export class Poller {
  /**
   * @param {{redis: any, group: string, memberId: string, incarnation: string, handler: Handler,
   *   concurrency?: number, settings?: PollerSettings, log?: (line: string) => void, stream?: string,
   *   metrics?: import('./metrics.js').WorkerMetrics}} o
   */
  constructor({ redis, group, memberId, incarnation, handler, concurrency, settings = {}, log, stream = '', metrics }) {
    this.redis = redis;
    this.group = group;
    /** The stream prefix (the destination name of trace spans). */
    this.stream = stream;
    this.memberId = memberId;
    this.incarnation = incarnation;
    this.handler = handler;
    this.settings = {
      batch: 50, maxDeliveries: 5, retryAfterMs: 1000, reclaimEveryMs: 5000, reclaimIdleMs: 30_000,
      wakeBlockMs: 10_000, idleSleepMs: 50, ...settings,
    };
    /** A concurrency the application fixed (else the coordinator's maxConcurrency). */
    this.fixedConcurrency = concurrency;
    this.slots = new Slots(concurrency ?? 1);
    this.log = log ?? ((line) => process.stderr.write(line + '\n'));
    this.metrics = metrics;
    /** @type {Map<number, ShardRun>} */
    this.shards = new Map();
    /** @type {Map<number, Promise<void>>} runners still ending (a loss), per index */
    this.ending = new Map();
    /** @type {Map<number, Watch>} the wake-up reads, per bundle */
    this.watches = new Map();
    /** A cluster: one bundle per hash slot (the keys of one command share a slot). */
    this.clustered = Boolean(redis?.isCluster);
    /** Handler calls may start before this (monotonic seconds). */
    this.leaseUntil = -Infinity;
    /** @type {NodeJS.Timeout|null} */
    this.leaseTimer = null;
    this.handled = 0;
    this.failed = 0;
    this.retried = 0;
    this.deadLettered = 0;
    /** Always 0 here: this client has no stall check of its own (the metric keeps the Python
     * worker's names; a refused shard is reported in stalledShards). */
    this.stalls = 0;
    /** Wake-up reads sent (XREAD BLOCK), and connections opened for them. */
    this.wakeReads = 0;
    this.wakeConnections = 0;
    /** @type {Map<number, {shard: number, pending: number, lag: number|null}>} XINFO GROUPS of the
     * DRAINING shards (and of every shard when `measureLag`), as last measured */
    this.figures = new Map();
    this.measureLag = false;
    this.closed = false;
    this.readSignal = new Signal();
    this.reclaimTick = new Signal();
    /** @type {{shard: ShardRun, id: string, resolve: (reply: any) => void, reject: (err: any) => void}[]} */
    this.acks = [];
    this.ackScheduled = false;
    /** @type {Promise<void>|null} */
    this.loops = null;
    this._pollingLogged = -Infinity;
  }

  leaseValid() {
    return monotonic() < this.leaseUntil;
  }

  /** The connections this poller holds for wake-up reads now (one per bundle that blocks). */
  get wakeConnectionsOpen() {
    return [...this.watches.values()].filter((w) => w.connection).length;
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
      this.readSignal.notify();
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
      const shard = new ShardRun(index, spec.key, spec.state === 'DRAINING', this.clustered ? keySlot(spec.key) : 0);
      this.shards.set(index, shard);
      const before = Promise.all([old?.done, this.ending.get(index)]);
      shard.done = before.then(() => {
        this.#attach(shard);
        return this.#run(shard);
      }).catch((err) => {
        this.log(`${this.memberId}: shard ${index} runner failed: ${err?.stack ?? err}`);
      }).finally(() => this.#detach(shard));
    }
    this.#startLoops();
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

  /** What it reports of the DRAINING shards it holds (`drainProgress`: pending and lag of its
   * group, as last measured every `reclaimEveryMs`). Operators see it; retirement never rests on it. */
  drainProgress() {
    return [...this.shards.values()]
      .filter((s) => s.draining && !s.stopped && this.figures.has(s.index))
      .map((s) => /** @type {any} */ (this.figures.get(s.index)));
  }

  /** Everything stops (after the member left). */
  async close() {
    this.closed = true;
    this.lost([...this.shards.keys()]);
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    this.readSignal.notify();
    this.reclaimTick.notify();
    await Promise.all(this.ending.values());
    for (const watch of this.watches.values()) this.#closeWatch(watch);
    await this.loops;
  }

  // --- internals: the shards ------------------------------------------------

  /** @param {ShardRun} shard @param {boolean} lost */
  #stopShard(shard, lost) {
    shard.stopped = true;
    if (lost) {
      shard.lost = true;
      shard.controller?.abort(new Error('the shard was lost'));
    }
    this.slots.cancel(shard);
    shard.wake();
    this.#detach(shard);
  }

  /** @param {string} why */
  #abortAll(why) {
    for (const shard of this.shards.values()) shard.controller?.abort(new Error(why));
  }

  /** Handle the shard's queue, one entry at a time in id order (the reader fills it).
   * @param {ShardRun} shard */
  async #run(shard) {
    this.readSignal.notify();
    while (!shard.stopped) {
      if (!this.leaseValid()) {
        // After a pause nothing is read or started until a heartbeat confirms the lease.
        await shard.pause(Infinity);
        continue;
      }
      if (shard.queue.length === 0) {
        await shard.pause(Infinity);
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
      if (shard.state !== 'caughtUp' && shard.queue.length < this.settings.batch) this.readSignal.notify();
    }
    await Promise.all(shard.acks);
  }

  /**
   * @param {ShardRun} shard @param {unknown} err @param {string} doing
   * @returns {number} how long to wait before trying again (ms)
   */
  #troubleDelay(shard, err, doing) {
    const text = err instanceof Error ? err.message : String(err);
    if (isFenced(err)) {
      if (!shard.troubled) {
        this.log(`${this.memberId}: shard ${shard.index} (${shard.key}) refused: ${text}; ` +
          'telling the coordinator (stalledShards), which restores it or takes it away');
      }
      shard.troubled = text;
      return 500;
    }
    shard.failures += 1;
    if (shard.failures === 1 || shard.failures % 20 === 0) {
      this.log(`${this.memberId}: Redis failed while ${doing} shard ${shard.index}: ${text}`);
    }
    if (!isTransient(err) && /^NOGROUP|no such key/i.test(text)) shard.troubled = text;
    return Math.min(2000, 50 * 2 ** Math.min(shard.failures, 6)) * (0.5 + Math.random() * 0.5);
  }

  /** @param {ShardRun} shard @param {unknown} err @param {string} doing */
  async #trouble(shard, err, doing) {
    if (shard.stopped) return;
    await shard.pause(this.#troubleDelay(shard, err, doing));
  }

  /** A read of the shard failed: read again later. @param {ShardRun} shard @param {unknown} err */
  #readFailed(shard, err) {
    if (shard.stopped) return;
    shard.retryAt = Date.now() + this.#troubleDelay(shard, err, 'reading');
    if (shard.state === 'caughtUp') shard.state = 'reading';
  }

  /** A read of the shard succeeded. @param {ShardRun} shard */
  #readFine(shard) {
    if (shard.troubled) {
      this.log(`${this.memberId}: shard ${shard.index} readable again`);
      shard.troubled = null;
    }
    shard.failures = 0;
    shard.retryAt = 0;
  }

  // --- internals: the reader, the wake-up reads, the reclaimer ----------------

  #startLoops() {
    if (this.loops || this.closed) return;
    this.loops = Promise.all([this.#reader(), this.#reclaimer()]).then(() => undefined, (err) => {
      this.log(`${this.memberId}: the poller failed: ${err?.stack ?? err}`);
    });
  }

  /** Reads the shards that may have entries and have room in their queue: claims one by one,
   * the others of a bundle in one read.lua call; waits to be woken when none may. */
  async #reader() {
    const s = this.settings;
    while (!this.closed) {
      if (!this.leaseValid()) {
        await this.readSignal.wait(); // renewed() wakes it
        continue;
      }
      const now = Date.now();
      let next = Infinity;
      /** @type {Promise<void>[]} */
      const calls = [];
      /** @type {Map<number, ShardRun[]>} */
      const bundles = new Map();
      for (const shard of this.shards.values()) {
        if (shard.stopped || shard.state === 'caughtUp' || shard.queue.length >= s.batch) continue;
        if (shard.retryAt > now) {
          next = Math.min(next, shard.retryAt);
          continue;
        }
        if (shard.state === 'claiming') {
          calls.push(this.#claim(shard));
        } else {
          const list = bundles.get(shard.bundle);
          if (list) list.push(shard);
          else bundles.set(shard.bundle, [shard]);
        }
      }
      for (const list of bundles.values()) calls.push(this.#readBundle(list));
      if (calls.length) await Promise.all(calls);
      else await this.readSignal.wait(next - now);
    }
  }

  /** The backlog earlier owners left, `batch` at a time. @param {ShardRun} shard */
  async #claim(shard) {
    const s = this.settings;
    /** @type {any} */
    let reply;
    try {
      reply = await runScript(this.redis, 'claim', [shard.key, shard.owners],
        [this.group, this.memberId, this.incarnation, this.memberId, 0, s.batch, shard.claimCursor]);
    } catch (err) {
      this.#readFailed(shard, err);
      return;
    }
    if (shard.stopped) return;
    this.#readFine(shard);
    const [cursor, entries] = reply;
    shard.claimCursor = String(cursor);
    if (shard.claimCursor === '0-0') shard.state = 'reading';
    this.#enqueueClaimed(shard, entries);
  }

  /** New entries of several shards of one bundle, in one fenced read. @param {ShardRun[]} list */
  async #readBundle(list) {
    /** @type {any} */
    let reply;
    try {
      reply = await runScript(this.redis, 'read', ...this.#readArgs(list, false));
    } catch (err) {
      for (const shard of list) this.#readFailed(shard, err);
      return;
    }
    this.#take(list, reply);
  }

  /** What a fenced read of these shards returned: entries queued, tails noted, refusals.
   * @param {ShardRun[]} list @param {any[]} reply */
  #take(list, reply) {
    list.forEach((shard, i) => {
      if (shard.stopped) return; // revoked or lost meanwhile: what it read stays pending for the next owner
      const [refused, entries, tail] = reply[i];
      if (refused) {
        this.#readFailed(shard, Object.assign(new Error(String(refused)), { name: 'ShardRefused' }));
        return;
      }
      this.#readFine(shard);
      for (const [id, flat] of entries ?? []) {
        shard.lastRead = String(id);
        shard.queue.push(this.#message(shard, String(id), flat, 1, false));
      }
      if ((entries ?? []).length) shard.wake();
      if (tail) {
        shard.tail = String(tail);
        if (shard.state !== 'caughtUp') {
          shard.state = 'caughtUp';
          this.#caughtUp(shard);
        }
      } else if (shard.state === 'caughtUp') {
        shard.state = 'reading'; // more to read: the reader goes on
        this.readSignal.notify();
      }
    });
  }

  /** The arguments of read.lua for these shards. @param {ShardRun[]} list @param {boolean} knownTails */
  #readArgs(list, knownTails) {
    const s = this.settings;
    /** @type {[string[], (string|number)[]]} */
    const args = [
      list.flatMap((x) => [x.key, x.owners]),
      [this.group, this.memberId, this.incarnation, this.memberId,
        ...list.flatMap((x) => [s.batch, x.lastRead, knownTails ? x.tail : ''])],
    ];
    return args;
  }

  /** @param {ShardRun} shard */
  #attach(shard) {
    if (shard.stopped || this.closed) return;
    let watch = this.watches.get(shard.bundle);
    if (!watch) {
      const fresh = new Watch(shard.bundle);
      this.watches.set(shard.bundle, fresh);
      fresh.done = this.#watch(fresh).catch((err) => {
        this.log(`${this.memberId}: the wake-up reads failed: ${err?.stack ?? err}`);
      });
      watch = fresh;
    }
    watch.shards.set(shard.index, shard);
    watch.changed.notify();
  }

  /** The shard is no longer read: a wake-up read naming it ends at once. @param {ShardRun} shard */
  #detach(shard) {
    const watch = this.watches.get(shard.bundle);
    if (!watch || watch.shards.get(shard.index) !== shard) return;
    watch.shards.delete(shard.index);
    if (watch.blockedOn?.has(shard.index)) this.#cancelBlock(watch);
    if (!watch.shards.size) this.#closeWatch(watch);
    watch.changed.notify();
  }

  /** @param {ShardRun} shard */
  #caughtUp(shard) {
    const watch = this.watches.get(shard.bundle);
    if (!watch) return;
    // A wake-up read in flight that does not name it: block again, naming it too (rare: a read
    // blocks only once no shard of its bundle is to be read).
    if (watch.blockedOn && !watch.blockedOn.has(shard.index)) this.#cancelBlock(watch);
    watch.changed.notify();
  }

  /** End the wake-up read in flight by closing its connection (CLIENT UNBLOCK needs admin
   * rights); the next one opens another. @param {Watch} watch */
  #cancelBlock(watch) {
    const connection = watch.connection;
    watch.connection = null;
    if (!connection) return;
    if (watch.blockedOn) watch.cancelled = true;
    connection.disconnect();
  }

  /** @param {Watch} watch */
  #closeWatch(watch) {
    watch.closed = true;
    this.#cancelBlock(watch);
    if (this.watches.get(watch.bundle) === watch) this.watches.delete(watch.bundle);
    watch.changed.notify();
  }

  /** A connection of its own for a blocked read (it holds the connection while it blocks). */
  #wakeConnection() {
    this.wakeConnections += 1;
    const redis = this.redis;
    /** @type {any} */
    let connection;
    if (redis.isCluster) {
      connection = redis.duplicate(undefined, {
        slotsRefreshInterval: 0, enableReadyCheck: false,
        redisOptions: { ...redis.options.redisOptions, disableClientInfo: true, enableReadyCheck: false },
      });
    } else {
      connection = redis.duplicate({ disableClientInfo: true, enableReadyCheck: false, lazyConnect: false });
    }
    connection.on?.('error', () => {});
    return connection;
  }

  /** The wake-up reads of one bundle, for as long as it has shards: once no shard of the bundle
   * is to be read and some caught up, one XREAD BLOCK from each caught-up shard's tail; the
   * shards it saw entries of are read again. @param {Watch} watch */
  async #watch(watch) {
    const s = this.settings;
    while (!watch.closed && !this.closed) {
      const now = Date.now();
      const shards = [...watch.shards.values()].filter((x) => !x.stopped);
      const waiting = shards.filter((x) => x.state === 'caughtUp');
      const toRead = shards.some((x) => x.state !== 'caughtUp' && x.retryAt <= now && x.queue.length < s.batch);
      if (!waiting.length || toRead) {
        await watch.changed.wait();
        continue;
      }
      if (now < watch.pollUntil) { // Redis refused XREAD: poll
        await sleep(watch.pollSleep);
        watch.pollSleep = Math.min(Math.max(2 * watch.pollSleep, 1), POLL_MAX_MS);
        this.#woken(waiting);
        continue;
      }
      if (!watch.connection) watch.connection = this.#wakeConnection();
      const connection = watch.connection;
      watch.blockedOn = new Set(waiting.map((x) => x.index));
      watch.cancelled = false;
      this.wakeReads += 1;
      /** @type {NodeJS.Timeout|undefined} */
      let overdue;
      try {
        overdue = setTimeout(() => { if (watch.connection === connection) this.#cancelBlock(watch); },
          s.wakeBlockMs + WAKE_GRACE_MS);
        const xread = connection.xread('COUNT', 1, 'BLOCK', s.wakeBlockMs, 'STREAMS',
          ...waiting.map((x) => x.key), ...waiting.map((x) => x.tail));
        // The fenced read right behind it on the same connection: Redis runs it as soon as the
        // XREAD returns (one round trip from an append to its entry here, not two). Only with a
        // valid lease and room; a shard with nothing new costs it one XREVRANGE.
        const reads = this.leaseValid() ? waiting.filter((x) => x.queue.length < s.batch) : [];
        const behind = reads.length ? runScript(connection, 'read', ...this.#readArgs(reads, true)) : null;
        behind?.catch(() => {});
        const reply = await xread;
        const keys = new Set((reply ?? []).map((/** @type {any[]} */ r) => String(r[0])));
        /** @type {any} */
        let read = null;
        if (behind) {
          try {
            read = await behind;
          } catch {
            // NOSCRIPT answered by EVAL, or the connection closed: the reader reads them
          }
        }
        if (read) this.#take(reads, read);
        this.#woken(waiting.filter((x) => keys.has(x.key) && !(read && reads.includes(x))));
      } catch (err) {
        if (watch.cancelled || watch.closed) continue; // ended on purpose: look again
        if (watch.connection === connection) {
          watch.connection = null;
          connection.disconnect();
        }
        const text = err instanceof Error ? err.message : String(err);
        if (err instanceof Error && err.name === 'ReplyError' && !isTransient(err) && !/^UNBLOCKED/.test(text)) {
          if (now - this._pollingLogged >= POLL_FALLBACK_MS) {
            this._pollingLogged = now;
            this.log(`${this.memberId}: Redis refused XREAD, polling instead for a while: ${text}`);
          }
          watch.pollUntil = Date.now() + POLL_FALLBACK_MS;
          watch.pollSleep = s.idleSleepMs;
        } else {
          await sleep(Math.min(2000, 100 + Math.random() * 400)); // an outage: the reads back off too
        }
        this.#woken(waiting);
      } finally {
        clearTimeout(overdue);
        watch.blockedOn = null;
        watch.cancelled = false;
      }
    }
  }

  /** Entries may wait past the tails of these shards: read them. @param {ShardRun[]} shards */
  #woken(shards) {
    let any = false;
    for (const shard of shards) {
      if (shard.stopped || shard.state !== 'caughtUp') continue;
      shard.state = 'reading';
      any = true;
    }
    if (any) this.readSignal.notify();
  }

  /** Every `reclaimEveryMs`: entries idle under other consumer names come back, and the pending
   * count and lag of the DRAINING shards (of every shard when `measureLag`) are measured. */
  async #reclaimer() {
    const s = this.settings;
    const tick = this.reclaimTick;
    while (!this.closed) {
      const timer = setTimeout(() => tick.notify(), s.reclaimEveryMs);
      timer.unref?.();
      await tick.wait();
      clearTimeout(timer);
      if (this.closed) return;
      await this.#measure();
      for (const shard of [...this.shards.values()]) {
        if (shard.stopped || shard.state === 'claiming' || shard.troubled) continue;
        try {
          const entries = await runScript(this.redis, 'reclaim', [shard.key, shard.owners],
            [this.group, this.memberId, this.incarnation, this.memberId, s.reclaimIdleMs, s.batch]);
          if (!shard.stopped && entries?.length) {
            this.#enqueueClaimed(shard, entries);
            shard.wake();
          }
        } catch (err) {
          if (isFenced(err)) this.#readFailed(shard, err);
          // else: Redis away or refusing; the next round is the retry
        }
      }
    }
  }

  async #measure() {
    /** @type {Map<number, {shard: number, pending: number, lag: number|null}>} */
    const figures = new Map();
    for (const shard of [...this.shards.values()]) {
      if (shard.stopped || !(shard.draining || this.measureLag)) continue;
      try {
        const groups = await this.redis.xinfo('GROUPS', shard.key);
        for (const flat of groups ?? []) {
          const info = toFields(flat.map(String));
          if (info.name !== this.group) continue;
          const lag = info.lag === undefined || info.lag === '' || info.lag === 'null' ? null : Number(info.lag);
          figures.set(shard.index, { shard: shard.index, pending: Number(info.pending) || 0, lag: Number.isFinite(lag) ? lag : null });
        }
      } catch {
        // a missing key, Redis away: not measured this round
      }
    }
    this.figures = figures;
  }

  /** @param {ShardRun} shard @param {any[]} entries */
  #enqueueClaimed(shard, entries) {
    const held = new Set(shard.queue.map((m) => m.id));
    for (const [id, flat, deliveries] of entries ?? []) {
      if (!flat || held.has(String(id))) continue; // deleted since, or already queued here
      shard.queue.push(this.#message(shard, String(id), flat, Number(deliveries) || 1, true));
    }
    shard.queue.sort((a, b) => compareIds(a.id, b.id));
    shard.wake();
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
    if (split.traceparent) message = /** @type {any} */ ({ ...message, fields, trace: split });
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
    if (message.deliveries > 1) this.retried += 1;
    const began = monotonic();
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
      this.metrics?.handlerSeconds(this.stream, this.group, monotonic() - began);
    }
    if (!ok) {
      // Aborted (lost, the lease ended, or past the revoke timeout): not acknowledged; it stays
      // pending for whoever owns the shard next (or this member again).
      if (!shard.stopped) shard.queue.unshift({ ...message, redelivered: true });
      return;
    }
    this.handled += 1;
    // Acknowledged while the next entry is handled (M9 holds: its handler completed); the
    // runner waits for every acknowledgement before it ends (a revoke reports it after them).
    const acked = this.#ack(shard, message.id);
    shard.acks.add(acked);
    acked.finally(() => shard.acks.delete(acked));
  }

  /** @param {ShardRun} shard @param {string} id */
  async #ack(shard, id) {
    for (let attempt = 0; !shard.lost; attempt++) {
      try {
        const reply = await this.#acknowledge(shard, id);
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

  /** Acknowledge `id`: with the other acknowledgements of this turn of the event loop, one
   * ack.lua call per bundle (each shard checked against its own owner token). Its shard's reply:
   * the number acknowledged, or its refusal. @param {ShardRun} shard @param {string} id
   * @returns {Promise<number|string>} */
  #acknowledge(shard, id) {
    return new Promise((resolve, reject) => {
      this.acks.push({ shard, id, resolve, reject });
      if (!this.ackScheduled) {
        this.ackScheduled = true;
        setImmediate(() => this.#flushAcks());
      }
    });
  }

  #flushAcks() {
    this.ackScheduled = false;
    const items = this.acks;
    this.acks = [];
    /** @type {Map<number, typeof items>} */
    const bundles = new Map();
    for (const item of items) {
      const list = bundles.get(item.shard.bundle);
      if (list) list.push(item);
      else bundles.set(item.shard.bundle, [item]);
    }
    for (const list of bundles.values()) {
      for (let i = 0; i < list.length; i += ACK_CHUNK) this.#ackCall(list.slice(i, i + ACK_CHUNK));
    }
  }

  /** @param {typeof this.acks} items */
  async #ackCall(items) {
    /** @type {Map<ShardRun, typeof items>} */
    const byShard = new Map();
    for (const item of items) {
      const list = byShard.get(item.shard);
      if (list) list.push(item);
      else byShard.set(item.shard, [item]);
    }
    const shards = [...byShard.keys()];
    try {
      const replies = await runScript(this.redis, 'ack', shards.flatMap((x) => [x.key, x.owners]), [
        this.group, this.memberId, this.incarnation,
        ...shards.map((x) => /** @type {any[]} */ (byShard.get(x)).length),
        ...shards.flatMap((x) => /** @type {any[]} */ (byShard.get(x)).map((item) => item.id)),
      ]);
      shards.forEach((shard, i) => {
        for (const item of /** @type {any[]} */ (byShard.get(shard))) item.resolve(replies[i]);
      });
    } catch (err) {
      for (const item of items) item.reject(err);
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
