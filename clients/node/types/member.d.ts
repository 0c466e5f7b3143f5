export namespace CLIENT {
    let name: string;
    let version: string;
    let featureLevel: number;
}
/** A newer process took this static member id over (FENCED REPLACED): stopped for good. */
export class MemberReplaced extends Error {
}
/** No answer of the coordinator could be read for a whole lease: it left the group. */
export class CoordinatorUnintelligible extends Error {
}
export class Member {
    /**
     * @param {{coordinator: import('./coordinator.js').Coordinator, streamPrefix: string, group: string,
     *   memberId: string, lifecycle: Lifecycle, incarnation?: string, static?: boolean,
     *   settings?: import('./machine.js').MemberSettings, client?: any, log?: (line: string) => void,
     *   transport?: {heartbeat: (request: any, options: {timeoutMs: number}) => Promise<any>}}} o
     */
    constructor(o: {
        coordinator: import("./coordinator.js").Coordinator;
        streamPrefix: string;
        group: string;
        memberId: string;
        lifecycle: Lifecycle;
        incarnation?: string;
        static?: boolean;
        settings?: import("./machine.js").MemberSettings;
        client?: any;
        log?: (line: string) => void;
        transport?: {
            heartbeat: (request: any, options: {
                timeoutMs: number;
            }) => Promise<any>;
        };
    });
    coordinator: import("./coordinator.js").Coordinator;
    /** How heartbeats travel: batched with the process's other members (`POST /v1/heartbeats`)
     * unless another transport is given. */
    transport: {
        heartbeat: (request: any, options: {
            timeoutMs: number;
        }) => Promise<any>;
    };
    lifecycle: Lifecycle;
    log: (line: string) => void;
    machine: MemberMachine;
    /** @type {Set<{shards: Set<number>, cancelled: boolean}>} */
    revokes: Set<{
        shards: Set<number>;
        cancelled: boolean;
    }>;
    /** @type {(() => void) | null} */
    _wake: (() => void) | null;
    _outage: boolean;
    _saidPending: string;
    stopping: boolean;
    get memberId(): string;
    get incarnation(): string;
    /** Heartbeat until stop(), then leave. Throws CoordinatorAuthError / CoordinatorRejected
     * (without leaving: the lease ends the membership), MemberReplaced, CoordinatorUnintelligible. */
    run(): Promise<void>;
    /** Leave gracefully (M14): revoke everything while heartbeating, then epoch -1. */
    stop(): void;
    wake(): void;
    /** One heartbeat exchange, its steps performed. */
    beat(): Promise<void>;
    #private;
}
/**
 * The lifecycle the member drives (the Poller is one).
 */
export type Lifecycle = {
    assigned: (shards: Set<number>, layout: any) => void;
    revoke: (shards: Set<number>, withinS: number) => Promise<void>;
    lost: (shards: Set<number>) => void;
    renewed: (until: number) => void;
    setConcurrency: (workers: number) => void;
    stalledShards: () => Set<number>;
    drainProgress?: () => {
        shard: number;
        pending: number;
        lag: number | null;
    }[];
};
import { MemberMachine } from './machine.js';
