/**
 * A worker: a member of `group` reading `stream`. `await worker.start()`, then `await worker.stop()`
 * to leave gracefully; `worker.done` settles when the member ends (rejects on 401/403, REPLACED...).
 * @param {WorkerOptions} options
 */
export function createWorker(options: WorkerOptions): Worker;
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
export function createProducer(options: ProducerOptions): {
    producer: Producer;
    start: () => Promise<Producer>;
    /** @param {string | Uint8Array} key @param {import('./producer.js').Fields} fields */
    publish: (key: string | Uint8Array, fields: import("./producer.js").Fields) => Promise<string>;
    /** @param {Parameters<Producer['publishMany']>[0]} messages */
    publishMany: (messages: Parameters<Producer["publishMany"]>[0]) => Promise<string[]>;
    close: () => Promise<void>;
};
export class Worker {
    /** @param {WorkerOptions} options */
    constructor(options: WorkerOptions);
    options: WorkerOptions;
    log: (line: string) => void;
    memberId: string;
    /** @type {{message: any, signal: AbortSignal, resolve: (v?: any) => void, reject: (e: any) => void}[]} */
    _items: {
        message: any;
        signal: AbortSignal;
        resolve: (v?: any) => void;
        reject: (e: any) => void;
    }[];
    /** @type {((v?: any) => void)[]} */
    _takers: ((v?: any) => void)[];
    handler: import("./poller.js").Handler;
    /** @type {Member|null} */
    member: Member | null;
    /** @type {Poller|null} */
    poller: Poller | null;
    /** @type {Promise<void>} */
    done: Promise<void>;
    _settle: {
        resolve: (value: void | PromiseLike<void>) => void;
        reject: (reason?: any) => void;
    };
    _ownsRedis: boolean;
    /** Connect and join; resolves once the heartbeat loop runs. */
    start(): Promise<this>;
    _starting: boolean;
    redis: any;
    /** Leave gracefully (revokes acknowledged, then epoch -1) and close. */
    stop(): Promise<void>;
    _stopRequested: boolean;
    _closed: boolean;
    [Symbol.asyncIterator](): AsyncGenerator<{
        message: any;
        signal: any;
    }, void, unknown>;
    #private;
}
export type ProducerOptions = {
    coordinatorUrl: string | string[];
    redisUrl?: string;
    redis?: any;
    stream: string;
    /**
     * the producer credential
     */
    token?: string;
    producerId?: string;
    log?: (line: string) => void;
};
export type Message = import("./poller.js").Message;
export type Handler = import("./poller.js").Handler;
export type PollerSettings = import("./poller.js").PollerSettings;
export type MemberSettings = import("./machine.js").MemberSettings;
export type Fields = import("./producer.js").Fields;
export type WorkerOptions = {
    /**
     * one, several comma-separated, or an array
     */
    coordinatorUrl: string | string[];
    /**
     * redis://, rediss://, redis+sentinel:// (default redis://127.0.0.1:6379)
     */
    redisUrl?: string;
    /**
     * an ioredis client to use instead of redisUrl
     */
    redis?: any;
    /**
     * the stream prefix
     */
    stream: string;
    /**
     * the consumer group
     */
    group: string;
    /**
     * the member credential (Authorization: Bearer)
     */
    token?: string;
    /**
     * default `<hostname>/<pid>`
     */
    memberId?: string;
    /**
     * a static member (keeps its id across restarts)
     */
    static?: boolean;
    /**
     * handler calls in flight at most (default: the group's maxConcurrency)
     */
    concurrency?: number;
    /**
     * without one, iterate the worker
     */
    handler?: import("./poller.js").Handler;
    poller?: import("./poller.js").PollerSettings;
    log?: (line: string) => void;
    /**
     * count this worker in these metrics
     * (the per-shard lag and pending are then measured every `reclaimEveryMs`)
     */
    metrics?: import("./metrics.js").WorkerMetrics;
};
import { Producer } from './producer.js';
import { Member } from './member.js';
import { Poller } from './poller.js';
export { Coordinator, CoordinatorAuthError, CoordinatorError, CoordinatorRejected, CoordinatorUnavailable, HeartbeatBatcher, MIN_PROTOCOL_VERSION, Negotiation } from "./coordinator.js";
export { CLIENT, Member, MemberReplaced, CoordinatorUnintelligible } from "./member.js";
export { MemberMachine, PROTOCOL_VERSION } from "./machine.js";
export { Poller, monotonic } from "./poller.js";
export { Producer, ProducerFenced, ProducerPaused, RedisOutOfMemory, ShardFull } from "./producer.js";
export { connectRedis, createRedis, parseRedisUrl } from "./redis.js";
export { jump, route, routingHash } from "./routing.js";
export { SCRIPTS, runScript } from "./scripts.js";
export { TRACEPARENT, TRACESTATE, enableTracing } from "./tracing.js";
export { HANDLER_BUCKETS, WorkerMetrics } from "./metrics.js";
