/** The stream stayed paused past the producer's pause timeout. */
export class ProducerPaused extends Error {
}
/** Redis refused the messages with OOM (used memory above maxmemory) for deliveryTimeoutMs. */
export class RedisOutOfMemory extends Error {
}
/** A shard stayed at its entry cap (retention `whenFull: refuse`) for deliveryTimeoutMs; `shard`
 * names its key. The messages routed there were not written. */
export class ShardFull extends Error {
    /** @param {string} message @param {string} shard */
    constructor(message: string, shard: string);
    shard: string;
}
/** Another process registered this producer's id: this one is fenced and publishes nothing more. */
export class ProducerFenced extends Error {
}
export class Producer {
    /**
     * @param {{coordinator: import('./coordinator.js').Coordinator, redis: any, stream: string,
     *   producerId?: string, pauseTimeoutMs?: number, maxRefreshes?: number, deliveryTimeoutMs?: number,
     *   idempotent?: boolean, log?: (line: string) => void}} o
     */
    constructor(o: {
        coordinator: import("./coordinator.js").Coordinator;
        redis: any;
        stream: string;
        producerId?: string;
        pauseTimeoutMs?: number;
        maxRefreshes?: number;
        deliveryTimeoutMs?: number;
        idempotent?: boolean;
        log?: (line: string) => void;
    });
    coordinator: import("./coordinator.js").Coordinator;
    redis: any;
    stream: string;
    producerId: string;
    pauseTimeoutMs: number;
    maxRefreshes: number;
    /** How long a publish keeps trying a full shard (retention's cap) before ShardFull. */
    deliveryTimeoutMs: number;
    log: (line: string) => void;
    /** @type {any} */
    layout: any;
    /** @type {import('./routing.js').Router|null} routes with `layout` (made again when it changes) */
    router: import("./routing.js").Router | null;
    metadataVersion: number;
    paused: boolean;
    intervalMs: number;
    inFlight: number;
    /** @type {Error|null} a refusal for good (401/403...) */
    fatal: Error | null;
    closed: boolean;
    /** @type {NodeJS.Timeout|null} */
    timer: NodeJS.Timeout | null;
    /** @type {Promise<void>|null} */
    beating: Promise<void> | null;
    /** @type {Set<number>} shard indexes that refused appends as full, for the next heartbeat */
    fullShards: Set<number>;
    fullReportedAt: number;
    /** Idempotence (feature level 6): asked for, the epoch given (null: none yet or an older
     * coordinator), the next sequence, the first sequences of the publishes in flight. */
    idempotent: boolean;
    /** @type {number|null} */
    epoch: number | null;
    nextSeq: number;
    /** @type {Map<number, number>} */
    open: Map<number, number>;
    /** How long the shards keep this producer's records after its last append there (ms). */
    windowMs: number;
    /** Calls Redis answered as repeats of an append already made (nothing appended again). */
    repeats: number;
    noEpochLogged: boolean;
    /** Register (the first heartbeat) and keep heartbeating in the background. */
    start(): Promise<this>;
    /** One heartbeat (concurrent callers share it). */
    heartbeat(): Promise<void>;
    /**
     * Publish one message; its entry id.
     * @param {string | Uint8Array} key @param {Fields} fields @returns {Promise<string>}
     */
    publish(key: string | Uint8Array, fields: Fields): Promise<string>;
    /**
     * Publish several messages (one append.lua call per shard); their entry ids, in order.
     * @param {(Outgoing | [string | Uint8Array, Fields])[]} messages @returns {Promise<string[]>}
     */
    publishMany(messages: (Outgoing | [string | Uint8Array, Fields])[]): Promise<string[]>;
    /** Stop heartbeating and tell the coordinator (leave). */
    close(): Promise<void>;
    #private;
}
export type Fields = Record<string, string | number | Buffer>;
export type Outgoing = {
    key: string | Uint8Array;
    fields: Fields;
};
