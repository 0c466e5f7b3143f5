// OpenTelemetry traces from publish to handler, as the Python client makes them (rsc.tracing):
// on whenever `@opentelemetry/api` can be imported (an optional dependency) and RSC_OTEL is not
// 0/false/off; spans go to the tracer provider the application registered (none: no-ops). A
// producer's call is a `send {stream}` span whose context each message carries in the reserved
// entry fields `rsc:traceparent` / `rsc:tracestate` (W3C trace context, written here, so no
// global propagator is needed); a handler call is a `process {stream}` span, a child of that
// context; a dead-lettering a `settle {stream}` span. `messaging.system` is `rsc`.

export const TRACEPARENT = 'rsc:traceparent';
export const TRACESTATE = 'rsc:tracestate';
const SYSTEM = 'rsc';

/** @type {any} */
let otel = null;
if (!['0', 'false', 'off', 'no'].includes(String(process.env.RSC_OTEL || '').toLowerCase())) {
  try {
    otel = await import('@opentelemetry/api');
  } catch {
    otel = null; // not installed: every function here is a no-op
  }
}

/** Turn tracing off (or on again, if the API was found) for this process. @param {boolean} on */
let enabled = true;
export function enableTracing(on) { enabled = on; }
const api = () => (enabled ? otel : null);

/** @param {any} span @returns {Record<string, string>} the fields carrying the span's context
 * (none for an invalid one: no SDK registered, every span a no-op) */
function carried(span) {
  const c = span.spanContext();
  if (!otel.isSpanContextValid(c)) return {};
  const flags = (c.traceFlags & 1) ? '01' : '00';
  /** @type {Record<string, string>} */
  const out = { [TRACEPARENT]: `00-${c.traceId}-${c.spanId}-${flags}` };
  const state = c.traceState?.serialize?.();
  if (state) out[TRACESTATE] = state;
  return out;
}

/**
 * Run `body(carriedFields)` in a `send {stream}` span (kind PRODUCER); without tracing,
 * `body({})`. @template T @param {string} stream @param {number} count
 * @param {(fields: Record<string, string>) => Promise<T>} body @returns {Promise<T>}
 */
export async function sendSpan(stream, count, body) {
  const o = api();
  if (!o) return body({});
  const tracer = o.trace.getTracer('rsc');
  return tracer.startActiveSpan(`send ${stream}`, {
    kind: o.SpanKind.PRODUCER,
    attributes: {
      'messaging.system': SYSTEM, 'messaging.operation.type': 'send', 'messaging.operation.name': 'send',
      'messaging.destination.name': stream, 'messaging.batch.message_count': count,
    },
  }, async (/** @type {any} */ span) => {
    try {
      const result = await body(carried(span));
      if (Array.isArray(result) && result.length === 1) span.setAttribute('messaging.message.id', String(result[0]));
      return result;
    } catch (err) {
      span.recordException(err);
      span.setStatus({ code: o.SpanStatusCode.ERROR });
      throw err;
    } finally {
      span.end();
    }
  });
}

/**
 * An entry's fields without the trace fields, and the trace context they carried.
 * @param {Record<string, string>} fields @returns {[Record<string, string>, Record<string, string>]}
 */
export function splitTrace(fields) {
  if (!(TRACEPARENT in fields)) return [fields, {}];
  const { [TRACEPARENT]: parent, [TRACESTATE]: state, ...rest } = fields;
  /** @type {Record<string, string>} */
  const trace = { traceparent: parent };
  if (state !== undefined) trace.tracestate = state;
  return [rest, trace];
}

/** The fields with the trace fields put back (a dead letter keeps them).
 * @param {Record<string, string>} fields @param {Record<string, string>} trace */
export function joinTrace(fields, trace) {
  if (!trace || !trace.traceparent) return fields;
  return { ...fields, [TRACEPARENT]: trace.traceparent, ...(trace.tracestate ? { [TRACESTATE]: trace.tracestate } : {}) };
}

/** @param {any} o @param {Record<string, string>} trace the parent context of a consumer span */
function parentOf(o, trace) {
  const m = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(trace?.traceparent || '');
  if (!m) return o.context.active();
  const spanContext = {
    traceId: m[1], spanId: m[2], traceFlags: parseInt(m[3], 16), isRemote: true,
    traceState: trace.tracestate && o.createTraceState ? o.createTraceState(trace.tracestate) : undefined,
  };
  return o.trace.setSpanContext(o.context.active(), spanContext);
}

/**
 * Run `body()` in a `process {stream}` (or `settle {stream}`) span (kind CONSUMER), a child of
 * the publisher's context; an error is recorded on it and thrown on.
 * @template T @param {'process'|'settle'} operation
 * @param {{stream: string, group: string, shard: number, id: string, deliveries: number, trace: Record<string, string>, settle?: string}} m
 * @param {() => Promise<T> | T} body @returns {Promise<T>}
 */
export async function consumerSpan(operation, m, body) {
  const o = api();
  if (!o) return body();
  const tracer = o.trace.getTracer('rsc');
  /** @type {Record<string, any>} */
  const attributes = {
    'messaging.system': SYSTEM, 'messaging.operation.type': operation, 'messaging.operation.name': operation,
    'messaging.destination.name': m.stream, 'messaging.consumer.group.name': m.group,
    'messaging.destination.partition.id': String(m.shard), 'messaging.message.id': m.id,
    'messaging.rsc.message.delivery_count': m.deliveries,
  };
  if (m.settle) attributes['messaging.rsc.settle'] = m.settle;
  return tracer.startActiveSpan(`${operation} ${m.stream}`, { kind: o.SpanKind.CONSUMER, attributes },
    parentOf(o, m.trace), async (/** @type {any} */ span) => {
      try {
        return await body();
      } catch (err) {
        span.recordException(err);
        span.setStatus({ code: o.SpanStatusCode.ERROR });
        throw err;
      } finally {
        span.end();
      }
    });
}
