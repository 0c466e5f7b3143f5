/** The Python worker's buckets (seconds). */
export const HANDLER_BUCKETS: number[];
/**
 * What a tracked worker shows the metrics (a `Worker` of this package is one).
 * @typedef {object} Tracked
 * @property {{stream: string, group: string}} options
 * @property {string} memberId
 * @property {import('./poller.js').Poller|null} poller
 * @property {import('./member.js').Member|null} member
 */
export class WorkerMetrics {
    /**
     * @param {{registry?: client.Registry, defaultMetrics?: boolean}} [o] the registry to register in
     *   (a new one by default); `defaultMetrics` adds prom-client's process metrics (true)
     */
    constructor({ registry, defaultMetrics }?: {
        registry?: client.Registry;
        defaultMetrics?: boolean;
    });
    registry: client.Registry<"text/plain; version=0.0.4; charset=utf-8">;
    /** @type {Set<Tracked>} */
    workers: Set<Tracked>;
    handler: client.Histogram<"group" | "stream">;
    /** Count this worker's figures (createWorker does it when given `metrics`). @param {Tracked} worker */
    track(worker: Tracked): void;
    /** @param {Tracked} worker */
    untrack(worker: Tracked): void;
    /** One handler call took `seconds`. @param {string} stream @param {string} group @param {number} seconds */
    handlerSeconds(stream: string, group: string, seconds: number): void;
    /** The exposition text. @returns {Promise<string>} */
    text(): Promise<string>;
    /**
     * Answer GET /metrics on `port` (0: any free port); resolves to the server once it listens.
     * @param {number} port @param {string} [host]
     * @returns {Promise<import('node:http').Server>}
     */
    serve(port: number, host?: string): Promise<import("node:http").Server>;
    #private;
}
/**
 * What a tracked worker shows the metrics (a `Worker` of this package is one).
 */
export type Tracked = {
    options: {
        stream: string;
        group: string;
    };
    memberId: string;
    poller: import("./poller.js").Poller | null;
    member: import("./member.js").Member | null;
};
import client from 'prom-client';
