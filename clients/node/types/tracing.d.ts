export function enableTracing(on: any): void;
/**
 * Run `body(carriedFields)` in a `send {stream}` span (kind PRODUCER); without tracing,
 * `body({})`. @template T @param {string} stream @param {number} count
 * @param {(fields: Record<string, string>) => Promise<T>} body @returns {Promise<T>}
 */
export function sendSpan<T>(stream: string, count: number, body: (fields: Record<string, string>) => Promise<T>): Promise<T>;
/**
 * An entry's fields without the trace fields, and the trace context they carried.
 * @param {Record<string, string>} fields @returns {[Record<string, string>, Record<string, string>]}
 */
export function splitTrace(fields: Record<string, string>): [Record<string, string>, Record<string, string>];
/** The fields with the trace fields put back (a dead letter keeps them).
 * @param {Record<string, string>} fields @param {Record<string, string>} trace */
export function joinTrace(fields: Record<string, string>, trace: Record<string, string>): Record<string, string>;
/**
 * Run `body()` in a `process {stream}` (or `settle {stream}`) span (kind CONSUMER), a child of
 * the publisher's context; an error is recorded on it and thrown on.
 * @template T @param {'process'|'settle'} operation
 * @param {{stream: string, group: string, shard: number, id: string, deliveries: number, trace: Record<string, string>, settle?: string}} m
 * @param {() => Promise<T> | T} body @returns {Promise<T>}
 */
export function consumerSpan<T>(operation: "process" | "settle", m: {
    stream: string;
    group: string;
    shard: number;
    id: string;
    deliveries: number;
    trace: Record<string, string>;
    settle?: string;
}, body: () => Promise<T> | T): Promise<T>;
export const TRACEPARENT: "rsc:traceparent";
export const TRACESTATE: "rsc:tracestate";
