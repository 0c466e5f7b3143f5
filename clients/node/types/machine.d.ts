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
export function steps(s?: Partial<Steps>): Steps;
export const PROTOCOL_VERSION: 2;
export const DEFAULT_REVOKE_TIMEOUT_MS: 60000;
export const MAX_WAIT_MS: 60000;
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
    constructor({ streamPrefix, group, memberId, incarnation, client, settings }: {
        streamPrefix: string;
        group: string;
        memberId: string;
        incarnation: string;
        client: {
            name: string;
            version: string;
            featureLevel?: number;
        };
        settings?: MemberSettings;
    });
    streamPrefix: string;
    group: string;
    memberId: string;
    incarnation: string;
    client: {
        name: string;
        version: string;
        featureLevel?: number;
    };
    settings: {
        /**
         * self-fence this fraction of the lease early (0.2)
         */
        safetyMargin: number;
        /**
         * after a failed heartbeat, try again this soon (0.5)
         */
        retryIntervalS: number;
        /**
         * until the coordinator says (3000)
         */
        heartbeatIntervalMs: number;
        /**
         * until the coordinator says (10000)
         */
        leaseTtlMs: number;
        /**
         * ask the coordinator to hold a "wait" answer (true)
         */
        longPoll: boolean;
        /**
         * a static member (false)
         */
        static: boolean;
    };
    epoch: number;
    /** @type {Shards} shards it holds: reading, or being stopped until acknowledged */
    owned: Shards;
    /** @type {Shards} */
    revoking: Shards;
    /** @type {Shards} stopped shards the coordinator has not yet heard of */
    toAck: Shards;
    /** @type {Shards} */
    pending: Shards;
    waiting: boolean;
    /** @type {any} */
    layout: any;
    metadataVersion: number;
    intervalS: number;
    leaseS: number;
    revokeTimeoutS: number;
    /** @type {number|null} */
    maxConcurrency: number | null;
    /** @type {string|null} */
    status: string | null;
    /** @type {number|null} when the last successful heartbeat was sent */
    lastOkSent: number | null;
    /** @type {number|null} */
    failingSince: number | null;
    /** @type {number|null} */
    unintelligibleSince: number | null;
    selfFenced: number;
    /** @type {string|null} */
    gaveUp: string | null;
    /** @type {string|null} */
    replaced: string | null;
    leaving: boolean;
    left: boolean;
    _urgent: boolean;
    /** @type {number|null} */
    _leaveSince: number | null;
    /** @type {{request: any, at: number}|null} */
    _sent: {
        request: any;
        at: number;
    } | null;
    _dueAt: number;
    /**
     * The heartbeat to send now, marked as sent at `now`.
     * @param {number} now
     * @param {{drainProgress?: any[], stalled?: Iterable<number>}} [extra]
     */
    request(now: number, extra?: {
        drainProgress?: any[];
        stalled?: Iterable<number>;
    }): Record<string, any>;
    /** The heartbeat it would send now, without marking anything sent.
     * @param {{drainProgress?: any[], stalled?: Iterable<number>}} [extra] */
    preview({ drainProgress, stalled }?: {
        drainProgress?: any[];
        stalled?: Iterable<number>;
    }): Record<string, any>;
    get readyToLeave(): boolean;
    /** When the next heartbeat should go (`now` or earlier: at once). @param {number} now */
    nextHeartbeatAt(now: number): number;
    /** Until when to wait for the answer to a request sent at `sent`. @param {number} sent */
    answerDeadline(sent: number): number;
    get leaveWaitS(): number;
    /** When it must have stopped everything without a successful heartbeat. */
    get fenceAt(): number;
    get leaveHandoffS(): number;
    /** How long in-flight work on revoked shards may take (seconds). */
    revokeBudgetS(): number;
    /**
     * The coordinator answered `request`.
     * @param {any} request @param {any} response @param {number} now
     * @returns {Steps}
     */
    receive(request: any, response: any, now: number): Steps;
    /**
     * No usable answer to `request` (transport failure, 5xx, timeout, refusal to retry).
     * @param {any} request @param {number} now @param {string} why
     * @param {{unintelligible?: boolean, retryAfterS?: number}} [o]
     * @returns {Steps}
     */
    failed(request: any, now: number, why: string, { unintelligible, retryAfterS }?: {
        unintelligible?: boolean;
        retryAfterS?: number;
    }): Steps;
    /** Time passed without an answer: the lease rule, and the leave's own handoff deadline.
     * @param {number} now @returns {Steps} */
    silent(now: number): Steps;
    /** The shell stopped `shards` (in-flight work finished): acknowledge them now.
     * @param {Iterable<number>} shards */
    revoked(shards: Iterable<number>): Steps;
    /** Leave gracefully (M14). */
    stop(): Steps;
    /** @param {any} request */
    _sentAt(request: any): number;
    _mayLongPoll(): boolean;
    _heldS(): number;
    /** @param {string[]} warnings @returns {Steps} */
    _dropAll(warnings: string[]): Steps;
    /** @param {string[]} warnings @returns {Steps} */
    _giveUp(warnings: string[]): Steps;
}
export type Shards = Set<number>;
export type Steps = {
    /**
     * drop at once, without acknowledging
     */
    lost: Shards;
    /**
     * what it holds is its own until then (-Infinity: nothing)
     */
    renewUntil: number | null;
    concurrency: number | null;
    /**
     * stop reading; in-flight work finishes; then revoked(shards)
     */
    stop: Shards;
    /**
     * start reading, with `layout`
     */
    start: Shards;
    layout: any;
    warnings: string[];
    unanswered: string | null;
    answered: boolean;
    gaveUp: string | null;
    replaced: string | null;
};
export type MemberSettings = {
    /**
     * self-fence this fraction of the lease early (0.2)
     */
    safetyMargin?: number;
    /**
     * after a failed heartbeat, try again this soon (0.5)
     */
    retryIntervalS?: number;
    /**
     * until the coordinator says (3000)
     */
    heartbeatIntervalMs?: number;
    /**
     * until the coordinator says (10000)
     */
    leaseTtlMs?: number;
    /**
     * ask the coordinator to hold a "wait" answer (true)
     */
    longPoll?: boolean;
    /**
     * a static member (false)
     */
    static?: boolean;
};
