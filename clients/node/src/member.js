// The member runtime: the shell that drives one MemberMachine (src/machine.js). Every protocol
// decision is the machine's; this sends its heartbeats, performs its steps on the poller (lost,
// renewUntil, concurrency, stop, start, in that order), runs revokes concurrently with the
// heartbeats, and logs to stderr.
import { randomUUID } from 'node:crypto';
import { CoordinatorAuthError, CoordinatorRejected, CoordinatorUnavailable, HeartbeatBatcher } from './coordinator.js';
import { MemberMachine } from './machine.js';
import { monotonic } from './poller.js';

export const CLIENT = { name: 'rsc-node', version: '0.1.0', featureLevel: 7 };
const STATUSES = new Set(['OK', 'REVOKE_PENDING', 'SYNC_METADATA', 'FENCED', 'UNKNOWN_MEMBER']);

/** A newer process took this static member id over (FENCED REPLACED): stopped for good. */
export class MemberReplaced extends Error {}
/** No answer of the coordinator could be read for a whole lease: it left the group. */
export class CoordinatorUnintelligible extends Error {}

/**
 * The lifecycle the member drives (the Poller is one).
 * @typedef {object} Lifecycle
 * @property {(shards: Set<number>, layout: any) => void} assigned
 * @property {(shards: Set<number>, withinS: number) => Promise<void>} revoke
 * @property {(shards: Set<number>) => void} lost
 * @property {(until: number) => void} renewed
 * @property {(workers: number) => void} setConcurrency
 * @property {() => Set<number>} stalledShards
 * @property {() => {shard: number, pending: number, lag: number|null}[]} [drainProgress]
 */

/** @param {any} r */
function intelligible(r) {
  return r && typeof r === 'object' && STATUSES.has(r.status) && Number.isFinite(r.memberEpoch) &&
    Number.isFinite(r.heartbeatIntervalMs) && r.heartbeatIntervalMs > 0 && Number.isFinite(r.leaseTtlMs) &&
    r.leaseTtlMs > 0 && Number.isFinite(r.metadataVersion);
}

export class Member {
  /**
   * @param {{coordinator: import('./coordinator.js').Coordinator, streamPrefix: string, group: string,
   *   memberId: string, lifecycle: Lifecycle, incarnation?: string, static?: boolean,
   *   settings?: import('./machine.js').MemberSettings, client?: any, log?: (line: string) => void,
   *   transport?: {heartbeat: (request: any, options: {timeoutMs: number}) => Promise<any>}}} o
   */
  constructor(o) {
    this.coordinator = o.coordinator;
    /** How heartbeats travel: batched with the process's other members (`POST /v1/heartbeats`)
     * unless another transport is given. */
    this.transport = o.transport ?? new HeartbeatBatcher(o.coordinator);
    this.lifecycle = o.lifecycle;
    this.log = o.log ?? ((line) => process.stderr.write(line + '\n'));
    this.machine = new MemberMachine({
      streamPrefix: o.streamPrefix,
      group: o.group,
      memberId: o.memberId,
      incarnation: o.incarnation ?? randomUUID().replace(/-/g, ''),
      client: o.client ?? CLIENT,
      settings: { ...o.settings, static: o.static ?? o.settings?.static ?? false },
    });
    /** @type {Set<{shards: Set<number>, cancelled: boolean}>} */
    this.revokes = new Set();
    /** @type {(() => void) | null} */
    this._wake = null;
    this._outage = false;
    this._saidPending = '';
    this.stopping = false;
  }

  get memberId() { return this.machine.memberId; }
  get incarnation() { return this.machine.incarnation; }

  /** Heartbeat until stop(), then leave. Throws CoordinatorAuthError / CoordinatorRejected
   * (without leaving: the lease ends the membership), MemberReplaced, CoordinatorUnintelligible. */
  async run() {
    const m = this.machine;
    while (!m.left) {
      this.#perform(m.silent(monotonic()));
      const now = monotonic();
      const due = m.nextHeartbeatAt(now);
      if (due <= now) {
        await this.beat();
        continue;
      }
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, Math.min(60_000, (due - now) * 1000 + 1));
        this._wake = () => { clearTimeout(timer); resolve(undefined); };
      });
      this._wake = null;
    }
    // Revokes still running (a leave waits for none: it is sent once nothing is held).
    if (m.replaced) throw new MemberReplaced(`${this.memberId}: ${m.replaced}`);
    if (m.gaveUp) throw new CoordinatorUnintelligible(`${this.memberId}: ${m.gaveUp}`);
  }

  /** Leave gracefully (M14): revoke everything while heartbeating, then epoch -1. */
  stop() {
    if (this.machine.leaving) return;
    this.stopping = true;
    this.#perform(this.machine.stop());
    this.wake();
  }

  wake() {
    const w = this._wake;
    this._wake = null;
    if (w) w();
  }

  /** One heartbeat exchange, its steps performed. */
  async beat() {
    const m = this.machine;
    const sent = monotonic();
    const request = m.request(sent, {
      stalled: this.lifecycle.stalledShards(), drainProgress: this.lifecycle.drainProgress?.() ?? [],
    });
    const timeoutMs = Math.max(50, (m.answerDeadline(sent) - sent) * 1000);
    /** @type {any} */
    let response;
    let why = 'no answer in time';
    let unintelligible = false;
    /** @type {number|undefined} */
    let retryAfterS;
    try {
      response = await this.transport.heartbeat(request, { timeoutMs });
      if (!intelligible(response)) {
        why = `an answer this client cannot read: ${JSON.stringify(response).slice(0, 200)}`;
        unintelligible = true;
        response = undefined;
      }
    } catch (err) {
      if (err instanceof CoordinatorUnavailable) {
        why = err.message;
        if (err.retryAfterMs !== undefined) retryAfterS = err.retryAfterMs / 1000;
      } else if ((err instanceof CoordinatorAuthError || err instanceof CoordinatorRejected) &&
        request.memberEpoch !== -1) {
        throw err;
      } else {
        why = err instanceof Error ? err.message : String(err);
      }
    }
    const now = monotonic();
    const steps = response === undefined
      ? m.failed(request, now, why, { unintelligible, retryAfterS })
      : m.receive(request, response, now);
    this.#perform(steps);
  }

  /** @param {import('./machine.js').Steps} steps */
  #perform(steps) {
    const m = this.machine;
    if (steps.unanswered !== null) {
      if (!this._outage) this.log(`${this.memberId}: heartbeats fail: ${steps.unanswered}`);
      this._outage = true;
    } else if (steps.answered && this._outage) {
      this.log(`${this.memberId}: heartbeats succeed again`);
      this._outage = false;
    }
    for (const line of steps.warnings) if (line !== steps.replaced) this.log(`${this.memberId}: ${line}`);
    if (steps.gaveUp) this.log(`${this.memberId}: ${steps.gaveUp}`);
    if (steps.replaced) this.log(`${this.memberId}: ${steps.replaced}`);
    if (steps.lost.size) {
      this.log(`${this.memberId}: lost shards ${[...steps.lost].sort((a, b) => a - b)}`);
      for (const revoke of this.revokes) {
        if ([...revoke.shards].some((s) => steps.lost.has(s))) revoke.cancelled = true;
      }
      this.lifecycle.lost(steps.lost);
    }
    if (steps.renewUntil !== null) this.lifecycle.renewed(steps.renewUntil);
    if (steps.concurrency !== null) this.lifecycle.setConcurrency(steps.concurrency);
    if (steps.stop.size) {
      this.log(`${this.memberId}: revoking shards ${[...steps.stop].sort((a, b) => a - b)}`);
      this.#revoke(steps.stop);
    }
    if (steps.start.size) {
      this.log(`${this.memberId}: reads shards ${[...steps.start].sort((a, b) => a - b)} (epoch ${m.epoch})`);
      this.lifecycle.assigned(steps.start, steps.layout);
    }
    const pending = [...m.pending].sort((a, b) => a - b).join(',');
    if (pending !== this._saidPending) {
      if (pending) this.log(`${this.memberId}: waits for shards ${pending}`);
      this._saidPending = pending;
    }
  }

  /** Stop `shards` while heartbeats go on, then acknowledge them. @param {Set<number>} shards */
  #revoke(shards) {
    const revoke = { shards, cancelled: false };
    this.revokes.add(revoke);
    this.lifecycle.revoke(shards, this.machine.revokeBudgetS())
      .catch((err) => this.log(`${this.memberId}: revoking ${[...shards]} failed: ${err?.stack ?? err}`))
      .finally(() => {
        this.revokes.delete(revoke);
        if (!revoke.cancelled) {
          this.machine.revoked(shards);
          this.wake(); // acknowledge now
        }
      });
  }
}
