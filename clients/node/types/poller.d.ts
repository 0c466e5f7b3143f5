/** The hash slot of a key (its `{tag}` when it has a non-empty one). @param {string} key */
export function keySlot(key: string): number;
/** Stream ids in order. @param {string} a @param {string} b */
export function compareIds(a: string, b: string): 0 | 1 | -1;
export function monotonic(): number;
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
export const POLL_FALLBACK_MS: 60000;
/** The longest pause between two polls of that fallback. */
export const POLL_MAX_MS: 200;
/** A wake-up read that has not returned this long after its block ended is given up (its
 * connection closed): a connection that died without a reset never holds the shards. */
export const WAKE_GRACE_MS: 5000;
/** Acknowledgements per ack.lua call at most. */
export const ACK_CHUNK: 1000;
export class Poller {
    /**
     * @param {{redis: any, group: string, memberId: string, incarnation: string, handler: Handler,
     *   concurrency?: number, settings?: PollerSettings, log?: (line: string) => void, stream?: string,
     *   metrics?: import('./metrics.js').WorkerMetrics}} o
     */
    constructor({ redis, group, memberId, incarnation, handler, concurrency, settings, log, stream, metrics }: {
        redis: any;
        group: string;
        memberId: string;
        incarnation: string;
        handler: Handler;
        concurrency?: number;
        settings?: PollerSettings;
        log?: (line: string) => void;
        stream?: string;
        metrics?: import("./metrics.js").WorkerMetrics;
    });
    redis: any;
    group: string;
    /** The stream prefix (the destination name of trace spans). */
    stream: string;
    memberId: string;
    incarnation: string;
    handler: Handler;
    settings: {
        /**
         * entries per read of a shard (50)
         */
        batch: number;
        /**
         * past this many deliveries an entry is dead-lettered (5)
         */
        maxDeliveries: number;
        /**
         * a failed entry is handled again this much later (1000)
         */
        retryAfterMs: number;
        /**
         * how often to look for entries idle under any consumer (5000)
         */
        reclaimEveryMs: number;
        /**
         * what counts as idle (30000)
         */
        reclaimIdleMs: number;
        /**
         * how long one wake-up read (XREAD BLOCK) waits in Redis (10000)
         */
        wakeBlockMs: number;
        /**
         * only where Redis refuses XREAD: the first pause of the
         *       polling fallback, doubling up to 200 ms (50)
         */
        idleSleepMs: number;
    };
    /** A concurrency the application fixed (else the coordinator's maxConcurrency). */
    fixedConcurrency: number;
    slots: Slots;
    log: (line: string) => void;
    metrics: import("./metrics.js").WorkerMetrics;
    /** @type {Map<number, ShardRun>} */
    shards: Map<number, ShardRun>;
    /** @type {Map<number, Promise<void>>} runners still ending (a loss), per index */
    ending: Map<number, Promise<void>>;
    /** @type {Map<number, Watch>} the wake-up reads, per bundle */
    watches: Map<number, Watch>;
    /** A cluster: one bundle per hash slot (the keys of one command share a slot). */
    clustered: boolean;
    /** Handler calls may start before this (monotonic seconds). */
    leaseUntil: number;
    /** @type {NodeJS.Timeout|null} */
    leaseTimer: NodeJS.Timeout | null;
    handled: number;
    failed: number;
    retried: number;
    deadLettered: number;
    /** Always 0 here: this client has no stall check of its own (the metric keeps the Python
     * worker's names; a refused shard is reported in stalledShards). */
    stalls: number;
    /** Wake-up reads sent (XREAD BLOCK), and connections opened for them. */
    wakeReads: number;
    wakeConnections: number;
    /** @type {Map<number, {shard: number, pending: number, lag: number|null}>} XINFO GROUPS of the
     * DRAINING shards (and of every shard when `measureLag`), as last measured */
    figures: Map<number, {
        shard: number;
        pending: number;
        lag: number | null;
    }>;
    measureLag: boolean;
    closed: boolean;
    readSignal: Signal;
    reclaimTick: Signal;
    /** @type {{shard: ShardRun, id: string, resolve: (reply: any) => void, reject: (err: any) => void}[]} */
    acks: {
        shard: ShardRun;
        id: string;
        resolve: (reply: any) => void;
        reject: (err: any) => void;
    }[];
    ackScheduled: boolean;
    /** @type {Promise<void>|null} */
    loops: Promise<void> | null;
    _pollingLogged: number;
    leaseValid(): boolean;
    /** The connections this poller holds for wake-up reads now (one per bundle that blocks). */
    get wakeConnectionsOpen(): number;
    /** What it holds is its own until `until` (monotonic seconds). @param {number} until */
    renewed(until: number): void;
    /** @param {number} workers */
    setConcurrency(workers: number): void;
    /** Start reading these shards (their backlog first). @param {Iterable<number>} indexes @param {any} layout */
    assigned(indexes: Iterable<number>, layout: any): void;
    /**
     * Stop starting handlers on these shards, let the calls in flight end (aborted past
     * `withinS`), flush their acknowledgements, forget them.
     * @param {Iterable<number>} indexes @param {number} withinS
     */
    revoke(indexes: Iterable<number>, withinS: number): Promise<void>;
    /** Stop at once: abort in-flight calls, no acknowledgement (someone else owns them now).
     * @param {Iterable<number>} indexes */
    lost(indexes: Iterable<number>): void;
    /** Shards it holds but cannot read (the scripts refuse them: owner token or group gone). */
    stalledShards(): Set<number>;
    /** What it reports of the DRAINING shards it holds (`drainProgress`: pending and lag of its
     * group, as last measured every `reclaimEveryMs`). Operators see it; retirement never rests on it. */
    drainProgress(): any[];
    /** Everything stops (after the member left). */
    close(): Promise<void>;
    #private;
}
export type Message = {
    /**
     * the stream entry id
     */
    id: string;
    /**
     * the shard index
     */
    shard: number;
    /**
     * the shard's stream key
     */
    key: string;
    fields: Record<string, string>;
    /**
     * 1 the first time
     */
    deliveries: number;
    memberId: string;
};
export type Handler = (message: Message, context: {
    signal: AbortSignal;
}) => Promise<unknown> | unknown;
export type PollerSettings = {
    /**
     * entries per read of a shard (50)
     */
    batch?: number;
    /**
     * past this many deliveries an entry is dead-lettered (5)
     */
    maxDeliveries?: number;
    /**
     * a failed entry is handled again this much later (1000)
     */
    retryAfterMs?: number;
    /**
     * how often to look for entries idle under any consumer (5000)
     */
    reclaimEveryMs?: number;
    /**
     * what counts as idle (30000)
     */
    reclaimIdleMs?: number;
    /**
     * how long one wake-up read (XREAD BLOCK) waits in Redis (10000)
     */
    wakeBlockMs?: number;
    /**
     * only where Redis refuses XREAD: the first pause of the
     *       polling fallback, doubling up to 200 ms (50)
     */
    idleSleepMs?: number;
};
/**
 * Where a shard's reading stands: `claiming` its backlog (entries earlier owners read but never
 * acknowledged), `reading` (entries may wait: the reader reads it when its queue has room), or
 * `caughtUp` (its last read returned the key's last id, `tail`: a wake-up read watches it).
 */
export type ReadState = "claiming" | "reading" | "caughtUp";
declare class Slots {
    /** @param {number} size */
    constructor(size: number);
    size: number;
    used: number;
    /** @type {{resolve: (ok: boolean) => void, owner: any}[]} */
    waiters: {
        resolve: (ok: boolean) => void;
        owner: any;
    }[];
    /** @param {any} owner @returns {Promise<boolean>} */
    acquire(owner: any): Promise<boolean>;
    release(): void;
    /** @param {number} size */
    resize(size: number): void;
    /** A waiter that no longer wants a slot gets `false`. @param {any} owner */
    cancel(owner: any): void;
    #private;
}
/**
 * Where a shard's reading stands: `claiming` its backlog (entries earlier owners read but never
 * acknowledged), `reading` (entries may wait: the reader reads it when its queue has room), or
 * `caughtUp` (its last read returned the key's last id, `tail`: a wake-up read watches it).
 * @typedef {'claiming'|'reading'|'caughtUp'} ReadState
 */
declare class ShardRun {
    /** @param {number} index @param {string} key @param {boolean} draining @param {number} bundle */
    constructor(index: number, key: string, draining: boolean, bundle: number);
    index: number;
    key: string;
    owners: string;
    draining: boolean;
    bundle: number;
    stopped: boolean;
    lost: boolean;
    /** @type {number} after a revoke: acknowledgements are given up past this time */
    stopDeadline: number;
    /** @type {(Message & {redelivered: boolean, notBefore: number})[]} */
    queue: (Message & {
        redelivered: boolean;
        notBefore: number;
    })[];
    /** @type {ReadState} */
    state: ReadState;
    claimCursor: string;
    lastRead: string;
    tail: string;
    /** No read before this (Date.now() ms): a failed read backs off. */
    retryAt: number;
    /** @type {string|null} why it cannot be read (reported in stalledShards) */
    troubled: string | null;
    /** @type {AbortController|null} the handler call in flight */
    controller: AbortController | null;
    signal: Signal;
    /** @type {Promise<void>} */
    done: Promise<void>;
    failures: number;
    /** @type {Set<Promise<void>>} acknowledgements in flight */
    acks: Set<Promise<void>>;
    wake(): void;
    /** An interruptible pause (Infinity: until woken). @param {number} ms */
    pause(ms: number): Promise<any>;
}
/** The wake-up read of a bundle of shards one XREAD may name: all of a member's shards on a
 * standalone Redis, one hash slot's on a cluster. */
declare class Watch {
    /** @param {number} bundle */
    constructor(bundle: number);
    bundle: number;
    /** @type {Map<number, ShardRun>} */
    shards: Map<number, ShardRun>;
    changed: Signal;
    /** @type {any} its own connection (a blocked read holds it), while one is open */
    connection: any;
    /** @type {Set<number>|null} the shards the XREAD in flight names */
    blockedOn: Set<number> | null;
    /** The XREAD in flight was ended on purpose (its connection closed). */
    cancelled: boolean;
    closed: boolean;
    /** Polling instead of blocking until then (Date.now() ms): Redis refused XREAD. */
    pollUntil: number;
    pollSleep: number;
    /** @type {Promise<void>} */
    done: Promise<void>;
}
/** Something to wait for and to be woken from, without losing a wake that came first. */
declare class Signal {
    set: boolean;
    /** @type {(() => void)|null} */
    _wake: (() => void) | null;
    notify(): void;
    /** Until notified (at once if it was since the last wait), or `ms` passed. @param {number} [ms] */
    wait(ms?: number): Promise<any>;
}
export {};
