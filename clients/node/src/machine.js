// The member side of the protocol as one sans-IO machine: a port of
// rsc/events/member_machine.py (read its docstring for the rules). It does no I/O and reads no
// clock: every method that depends on time takes `now` (seconds on a monotonic clock).
//
//   const request = machine.request(now)                 // send it
//   steps = machine.receive(request, answer, now)        // or machine.failed(request, now, why)
//   ... perform steps in order: lost, renewUntil, concurrency, stop, start ...
//   machine.revoked(shards)                              // once stopped shards are idle
//   steps = machine.silent(now)                          // when woken with no answer
//   machine.nextHeartbeatAt(now)                         // when to send the next one

export const PROTOCOL_VERSION = 2;
export const DEFAULT_REVOKE_TIMEOUT_MS = 60_000;
export const MAX_WAIT_MS = 60_000;

/** @typedef {Set<number>} Shards */
/**
 * @typedef {object} Steps
 * @property {Shards} lost           drop at once, without acknowledging
 * @property {number|null} renewUntil  what it holds is its own until then (-Infinity: nothing)
 * @property {number|null} concurrency
 * @property {Shards} stop           stop reading; in-flight work finishes; then revoked(shards)
 * @property {Shards} start          start reading, with `layout`
 * @property {any} layout
 * @property {string[]} warnings
 * @property {string|null} unanswered
 * @property {boolean} answered
 * @property {string|null} gaveUp
 * @property {string|null} replaced
 */

/** @param {Partial<Steps>} [s] @returns {Steps} */
export function steps(s = {}) {
  return {
    lost: new Set(), renewUntil: null, concurrency: null, stop: new Set(), start: new Set(),
    layout: null, warnings: [], unanswered: null, answered: false, gaveUp: null, replaced: null, ...s,
  };
}

/** @param {Iterable<number>} a @param {Iterable<number>} b */
const minus = (a, b) => { const out = new Set(a); for (const x of b) out.delete(x); return out; };
/** @param {Iterable<number>} a @param {Iterable<number>} b */
const union = (a, b) => new Set([...a, ...b]);
/** @param {Iterable<number>} a @param {Set<number>} b */
const inter = (a, b) => new Set([...a].filter((x) => b.has(x)));
/** @param {Set<number>} a @param {Set<number>} b */
const sameSet = (a, b) => a.size === b.size && [...a].every((x) => b.has(x));
const sorted = (/** @type {Iterable<number>} */ s) => [...s].sort((a, b) => a - b);

/**
 * @typedef {object} MemberSettings
 * @property {number} [safetyMargin]       self-fence this fraction of the lease early (0.2)
 * @property {number} [retryIntervalS]     after a failed heartbeat, try again this soon (0.5)
 * @property {number} [heartbeatIntervalMs] until the coordinator says (3000)
 * @property {number} [leaseTtlMs]         until the coordinator says (10000)
 * @property {boolean} [longPoll]          ask the coordinator to hold a "wait" answer (true)
 * @property {boolean} [static]            a static member (false)
 */

export class MemberMachine {
  /**
   * @param {{streamPrefix: string, group: string, memberId: string, incarnation: string,
   *   client: {name: string, version: string, featureLevel?: number}, settings?: MemberSettings}} o
   */
  constructor({ streamPrefix, group, memberId, incarnation, client, settings = {} }) {
    this.streamPrefix = streamPrefix;
    this.group = group;
    this.memberId = memberId;
    this.incarnation = incarnation;
    this.client = client;
    this.settings = {
      safetyMargin: 0.2, retryIntervalS: 0.5, heartbeatIntervalMs: 3000, leaseTtlMs: 10_000,
      longPoll: true, static: false, ...settings,
    };
    this.epoch = 0;
    /** @type {Shards} shards it holds: reading, or being stopped until acknowledged */
    this.owned = new Set();
    /** @type {Shards} */
    this.revoking = new Set();
    /** @type {Shards} stopped shards the coordinator has not yet heard of */
    this.toAck = new Set();
    /** @type {Shards} */
    this.pending = new Set();
    this.waiting = false;
    /** @type {any} */
    this.layout = { metadataVersion: 0, shards: [] };
    this.metadataVersion = 0;
    this.intervalS = this.settings.heartbeatIntervalMs / 1000;
    this.leaseS = this.settings.leaseTtlMs / 1000;
    this.revokeTimeoutS = DEFAULT_REVOKE_TIMEOUT_MS / 1000;
    /** @type {number|null} */
    this.maxConcurrency = null;
    /** @type {string|null} */
    this.status = null;
    /** @type {number|null} when the last successful heartbeat was sent */
    this.lastOkSent = null;
    /** @type {number|null} */
    this.failingSince = null;
    /** @type {number|null} */
    this.unintelligibleSince = null;
    this.selfFenced = 0;
    /** @type {string|null} */
    this.gaveUp = null;
    /** @type {string|null} */
    this.replaced = null;
    this.leaving = false;
    this.left = false;
    this._urgent = true;
    /** @type {number|null} */
    this._leaveSince = null;
    /** @type {{request: any, at: number}|null} */
    this._sent = null;
    this._dueAt = -Infinity;
  }

  // --- outputs ------------------------------------------------------------

  /**
   * The heartbeat to send now, marked as sent at `now`.
   * @param {number} now
   * @param {{drainProgress?: any[], stalled?: Iterable<number>}} [extra]
   */
  request(now, extra = {}) {
    const request = this.preview(extra);
    if (this.leaving && this._leaveSince === null) this._leaveSince = now;
    this._sent = { request, at: now };
    this._urgent = false;
    return request;
  }

  /** The heartbeat it would send now, without marking anything sent.
   * @param {{drainProgress?: any[], stalled?: Iterable<number>}} [extra] */
  preview({ drainProgress = [], stalled = [] } = {}) {
    const leave = this.readyToLeave;
    let waitMs = 0;
    if (this.waiting && this._mayLongPoll()) waitMs = Math.min(Math.round(this.intervalS * 1000), MAX_WAIT_MS);
    /** @type {Record<string, any>} */
    const request = {
      protocolVersion: PROTOCOL_VERSION,
      streamPrefix: this.streamPrefix,
      consumerGroup: this.group,
      memberId: this.memberId,
      incarnation: this.incarnation,
      memberEpoch: leave ? -1 : this.epoch,
      metadataVersion: this.metadataVersion,
      ownedShards: leave ? [] : sorted(this.owned),
      revokedShards: sorted(this.toAck),
      client: this.client,
    };
    if (drainProgress.length) request.drainProgress = drainProgress;
    if (waitMs) request.waitMs = waitMs;
    if (this.leaving && !leave) request.leaving = true;
    const stalledOwned = leave ? [] : sorted(inter(stalled, this.owned));
    if (stalledOwned.length) request.stalledShards = stalledOwned;
    if (this.settings.static) request.static = true;
    return request;
  }

  get readyToLeave() {
    return this.leaving && this.owned.size === 0 && !this.left;
  }

  /** When the next heartbeat should go (`now` or earlier: at once). @param {number} now */
  nextHeartbeatAt(now) {
    if (this.left) return Infinity;
    if (this._urgent || this.readyToLeave) return now;
    let due = Math.min(this._dueAt, this.fenceAt);
    if (this._leaveSince !== null && minus(this.owned, this.revoking).size) {
      due = Math.min(due, this._leaveSince + this.leaveHandoffS);
    }
    return due;
  }

  /** Until when to wait for the answer to a request sent at `sent`. @param {number} sent */
  answerDeadline(sent) {
    let deadline = Math.min(this.fenceAt, sent + this.leaseS + this._heldS());
    if (this.leaving) deadline = Math.min(deadline, sent + this.leaveWaitS);
    return deadline;
  }

  get leaveWaitS() {
    return Math.max(this.intervalS, 1.0);
  }

  /** When it must have stopped everything without a successful heartbeat. */
  get fenceAt() {
    if (this.lastOkSent === null || this.owned.size === 0) return Infinity;
    return this.lastOkSent + this.leaseS * (1 - this.settings.safetyMargin);
  }

  get leaveHandoffS() {
    return 2 * this.intervalS + 1.0;
  }

  /** How long in-flight work on revoked shards may take (seconds). */
  revokeBudgetS() {
    return Math.max(0.5, this.revokeTimeoutS - this.intervalS - 1.0);
  }

  // --- inputs -------------------------------------------------------------

  /**
   * The coordinator answered `request`.
   * @param {any} request @param {any} response @param {number} now
   * @returns {Steps}
   */
  receive(request, response, now) {
    const sent = this._sentAt(request);
    this._sent = null;
    /** @type {string[]} */
    const warnings = [];
    this.failingSince = this.unintelligibleSince = null;
    this.lastOkSent = sent;
    this.status = response.status;
    this.intervalS = response.heartbeatIntervalMs / 1000;
    this.leaseS = response.leaseTtlMs / 1000;
    if (response.revokeTimeoutMs != null) this.revokeTimeoutS = response.revokeTimeoutMs / 1000;
    if (response.layout) this.layout = response.layout;
    this.metadataVersion = response.metadataVersion;
    this._dueAt = (request.waitMs ? sent : now) + this.intervalS;
    if (request.memberEpoch === -1) {
      this.left = true;
      this.epoch = 0;
      this.toAck = new Set();
      this.pending = new Set();
      this.waiting = false;
      return steps({ warnings, answered: true });
    }
    if (response.status === 'FENCED' && response.fenceReason === 'REPLACED') {
      const message = `replaced: another process joined with member id ${JSON.stringify(this.memberId)} ` +
        '(static membership); this one drops every shard and stops';
      this.replaced = message;
      this.left = true;
      this.epoch = 0;
      return { ...this._dropAll([message]), answered: true, replaced: message };
    }
    if (response.status === 'FENCED' || response.status === 'UNKNOWN_MEMBER') {
      if (this.owned.size) {
        const why = response.fenceReason || 'not a member';
        warnings.push(`${response.status} by the coordinator (${why}); dropping every shard and rejoining`);
      }
      this._urgent = true;
      this.epoch = 0;
      return { ...this._dropAll(warnings), answered: true };
    }
    this.epoch = response.memberEpoch;
    this.toAck = minus(this.toAck, request.revokedShards ?? []);
    let concurrency = null;
    if (response.maxConcurrency !== this.maxConcurrency) {
      this.maxConcurrency = concurrency = response.maxConcurrency ?? 1;
    }
    const a = response.assignment ?? {};
    const assigned = new Set(a.assigned ?? []);
    const pending = new Set(a.pending ?? []);
    const revoke = new Set(a.revoke ?? []);
    const progressed = response.memberEpoch !== request.memberEpoch || !sameSet(pending, this.pending);
    this.pending = pending;
    this.waiting = response.status === 'REVOKE_PENDING' && revoke.size === 0;
    const stop = inter(minus(this.owned, this.revoking), union(revoke, minus(this.owned, assigned)));
    this.revoking = union(this.revoking, stop);
    this.toAck = union(this.toAck, minus(revoke, this.owned));
    const start = this.leaving ? new Set() : minus(minus(assigned, this.owned), revoke);
    this.owned = union(this.owned, start);
    if (this.toAck.size) {
      this._urgent = true;
    } else if (this.waiting && this._mayLongPoll() && (!request.waitMs || progressed || start.size)) {
      this._urgent = true;
    }
    return steps({
      stop, start, layout: this.layout, concurrency,
      renewUntil: sent + this.leaseS * (1 - this.settings.safetyMargin),
      warnings, answered: true,
    });
  }

  /**
   * No usable answer to `request` (transport failure, 5xx, timeout, refusal to retry).
   * @param {any} request @param {number} now @param {string} why
   * @param {{unintelligible?: boolean, retryAfterS?: number}} [o]
   * @returns {Steps}
   */
  failed(request, now, why, { unintelligible = false, retryAfterS } = {}) {
    const sent = this._sentAt(request);
    this._sent = null;
    const retry = Math.min(this.settings.retryIntervalS, this.intervalS);
    // Jitter (M3), and Retry-After when the coordinator gave one (M13).
    this._dueAt = now + retry * (0.5 + Math.random() * 0.5);
    if (retryAfterS !== undefined) this._dueAt = Math.max(this._dueAt, now + retryAfterS);
    /** @type {string[]} */
    const warnings = [];
    if (request.memberEpoch === -1) {
      this.left = true;
      this.epoch = 0;
      this.toAck = new Set();
      return steps({ warnings: [`leave not acknowledged (the lease will end it): ${why}`] });
    }
    if (this.failingSince === null) this.failingSince = sent;
    if (unintelligible) {
      if (this.unintelligibleSince === null) {
        this.unintelligibleSince = sent;
        warnings.push(`cannot read the coordinator's answer: ${why}`);
      } else if (now - this.unintelligibleSince >= this.leaseS) {
        return this._giveUp(warnings);
      }
    }
    const s = this.silent(now);
    return { ...s, warnings: [...warnings, ...s.warnings], unanswered: why };
  }

  /** Time passed without an answer: the lease rule, and the leave's own handoff deadline.
   * @param {number} now @returns {Steps} */
  silent(now) {
    if (now < this.fenceAt) {
      if (this._leaveSince !== null && now >= this._leaveSince + this.leaveHandoffS) {
        const stop = minus(this.owned, this.revoking);
        if (stop.size) {
          this.revoking = union(this.revoking, stop);
          return steps({ stop });
        }
      }
      return steps();
    }
    this.selfFenced += 1;
    return this._dropAll(['no heartbeat succeeded within the lease; dropping every shard']);
  }

  /** The shell stopped `shards` (in-flight work finished): acknowledge them now.
   * @param {Iterable<number>} shards */
  revoked(shards) {
    const done = inter(shards, this.revoking);
    if (done.size) {
      this.revoking = minus(this.revoking, done);
      this.owned = minus(this.owned, done);
      this.toAck = union(this.toAck, done);
      this._urgent = true;
    }
    return steps();
  }

  /** Leave gracefully (M14). */
  stop() {
    this.leaving = true;
    this._urgent = true;
    return steps();
  }

  // --- internals ----------------------------------------------------------

  /** @param {any} request */
  _sentAt(request) {
    if (this._sent === null || this._sent.request !== request) {
      throw new Error('an answer to a request this machine did not send last (use request())');
    }
    return this._sent.at;
  }

  _mayLongPoll() {
    return this.settings.longPoll && !(this.toAck.size || this.revoking.size) && this.failingSince === null;
  }

  _heldS() {
    return this._sent !== null ? (this._sent.request.waitMs ?? 0) / 1000 : 0;
  }

  /** @param {string[]} warnings @returns {Steps} */
  _dropAll(warnings) {
    const lost = this.owned;
    this.owned = new Set();
    this.revoking = new Set();
    this.toAck = new Set();
    this.pending = new Set();
    this.waiting = false;
    return steps({ lost, renewUntil: -Infinity, warnings });
  }

  /** @param {string[]} warnings @returns {Steps} */
  _giveUp(warnings) {
    const message = `no answer of the coordinator could be read for ${this.leaseS} s ` +
      `(a coordinator newer than this client ${this.client.name} ${this.client.version}?); ` +
      'leaving the group so that its shards move';
    this.gaveUp = message;
    const s = this._dropAll([...warnings, message]);
    this.leaving = true;
    this._urgent = true;
    return { ...s, gaveUp: message };
  }
}
