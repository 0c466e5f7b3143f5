/**
 * Exponential backoff with full jitter.
 * @param {number} attempt 0, 1, 2...
 * @param {number} [baseMs]
 * @param {number} [capMs]
 */
export function backoffMs(attempt: number, baseMs?: number, capMs?: number): number;
/** @param {string|null} value  Retry-After: seconds or an HTTP date. */
export function parseRetryAfter(value: string | null): number;
/**
 * @param {string | string[]} urls  one URL, several comma-separated, or an array
 * @returns {string[]}
 */
export function splitUrls(urls: string | string[]): string[];
/** The oldest protocol version this client can speak (docs/protocol.md, Version). */
export const MIN_PROTOCOL_VERSION: 1;
export const UNSUPPORTED_PROTOCOL: "UNSUPPORTED_PROTOCOL_VERSION";
/**
 * The protocol version spoken to the coordinators: the newest this client knows, stepped down
 * one version at a time when a coordinator refuses it (an older release answers a newer version
 * 400 `UNSUPPORTED_PROTOCOL_VERSION`), and down to what a newer coordinator answers in. Once
 * stepped down, the newest is tried again after `retryNewestMs` (the coordinators may have been
 * upgraded meanwhile). As the Python client's `Negotiation`.
 */
export class Negotiation {
    /** @param {{retryNewestMs?: number, now?: () => number}} [o] */
    constructor({ retryNewestMs, now }?: {
        retryNewestMs?: number;
        now?: () => number;
    });
    version: number;
    retryNewestMs: number;
    now: () => number;
    /** @type {number|null} */
    steppedDownAt: number | null;
    /** `body` with the version to speak now (a body without `protocolVersion` as it is).
     * @template T @param {T} body @returns {T} */
    stamp<T>(body: T): T;
    /** Whether a refusal with `code` of `sent` means: speak an older version, send it again.
     * @param {string|undefined} code @param {any} sent */
    refused(code: string | undefined, sent: any): boolean;
    /** An answer names the version it is in (from version 2 on): speak no newer one. @param {any} data */
    answered(data: any): void;
}
export class CoordinatorError extends Error {
    /**
     * @param {string} message
     * @param {{status?: number, code?: string, url?: string, retryAfterMs?: number, body?: any}} [info]
     */
    constructor(message: string, info?: {
        status?: number;
        code?: string;
        url?: string;
        retryAfterMs?: number;
        body?: any;
    });
    status: number;
    code: string;
    url: string;
    retryAfterMs: number;
    body: any;
}
/** 401 / 403: the credential is refused; the member or producer stops (M11). */
export class CoordinatorAuthError extends CoordinatorError {
}
/** A refusal that does not end by itself (a client bug, an unsupported version). */
export class CoordinatorRejected extends CoordinatorError {
}
/** No usable answer now: retry soon (within the lease). */
export class CoordinatorUnavailable extends CoordinatorError {
}
/** Codes answered with a 4xx that end by themselves (M13). */
export const RETRIED_CODES: Set<string>;
export class Coordinator {
    /**
     * @param {{urls: string | string[], token?: string, timeoutMs?: number, fetch?: typeof fetch}} options
     */
    constructor({ urls, token, timeoutMs, fetch: fetchImpl }: {
        urls: string | string[];
        token?: string;
        timeoutMs?: number;
        fetch?: typeof fetch;
    });
    urls: string[];
    token: string;
    timeoutMs: number;
    fetch: typeof fetch;
    /** The URL that answered last: tried first. */
    current: number;
    negotiation: Negotiation;
    /** Requests sent (each URL tried counts once). */
    requests: number;
    /**
     * POST `body`, stamped with the protocol version to speak (and sent again one version older
     * when the coordinator refuses the version); the answer.
     * @param {string} path @param {object} body @param {{timeoutMs?: number}} [options]
     * @returns {Promise<any>}
     */
    post(path: string, body: object, options?: {
        timeoutMs?: number;
    }): Promise<any>;
    /**
     * The heartbeats of one process's members in one request (`POST /v1/heartbeats`); per item
     * its answer or, for a refused item, a `CoordinatorRejected` (not thrown). The whole request
     * throws as `post` does, and `CoordinatorUnavailable` when the answer has not one response
     * per heartbeat.
     * @param {object[]} requests @param {{timeoutMs?: number}} [options]
     * @returns {Promise<(any|CoordinatorRejected)[]>}
     */
    heartbeats(requests: object[], options?: {
        timeoutMs?: number;
    }): Promise<(any | CoordinatorRejected)[]>;
    /**
     * POST `body` to `path` as it is; each URL is tried once at most, from the one that answered last,
     * moving on after a refused connection, a timeout or a 502/503/504.
     * @param {string} path
     * @param {object} body
     * @param {{timeoutMs?: number}} [options]
     * @returns {Promise<any>}
     */
    postRaw(path: string, body: object, { timeoutMs }?: {
        timeoutMs?: number;
    }): Promise<any>;
    #private;
}
/**
 * A member transport that batches heartbeats (`POST /v1/heartbeats`): each member's heartbeat
 * waits at most `lingerMs` for the other members of the process to heartbeat too, then one
 * request carries them all and each member gets its own answer (or its own error). A heartbeat
 * acknowledging a revoke (`revokedShards`) does not wait: another member waits for those
 * shards. A long poll (`waitMs`) goes on its own (`POST /v1/heartbeat`), at most
 * `maxLongPolls` at once; the others travel batched without it. A coordinator without the
 * batch route (404/405) gets single heartbeats from then on. As the Python `BatchingTransport`.
 */
export class HeartbeatBatcher {
    /** @param {Coordinator} coordinator @param {{lingerMs?: number, maxBatch?: number, maxLongPolls?: number}} [o] */
    constructor(coordinator: Coordinator, { lingerMs, maxBatch, maxLongPolls }?: {
        lingerMs?: number;
        maxBatch?: number;
        maxLongPolls?: number;
    });
    coordinator: Coordinator;
    lingerMs: number;
    maxBatch: number;
    maxLongPolls: number;
    longPolls: number;
    batched: boolean;
    /** Batch requests sent. */
    batchesSent: number;
    /** @type {{request: any, timeoutMs: number, resolve: (v: any) => void, reject: (e: any) => void}[]} */
    pending: {
        request: any;
        timeoutMs: number;
        resolve: (v: any) => void;
        reject: (e: any) => void;
    }[];
    /** @type {NodeJS.Timeout|null} */
    timer: NodeJS.Timeout | null;
    /** One member's answer. @param {any} request @param {{timeoutMs?: number}} [options] @returns {Promise<any>} */
    heartbeat(request: any, { timeoutMs }?: {
        timeoutMs?: number;
    }): Promise<any>;
    #private;
}
