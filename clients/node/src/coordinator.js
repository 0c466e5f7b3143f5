// The coordinator over HTTP (fetch): JSON bodies, a bearer token, several coordinator URLs
// (a standby's answers 503 STANDBY: the next is tried), Retry-After on 429/503.
//
// Errors, as the member and the producer treat them (docs/protocol.md, Errors; M11-M13):
//   CoordinatorAuthError     401/403: stop for good, never retry with this credential
//   CoordinatorRejected      another refusal that will not end by itself (400...): stop
//   CoordinatorUnavailable   no answer, a 5xx, 408, 429, 404 UNKNOWN_STREAM/GROUP,
//                            409 INCARNATION_MISMATCH/DELETED: retry (retryAfterMs when given)

import { PROTOCOL_VERSION } from './machine.js';

/** The oldest protocol version this client can speak (docs/protocol.md, Version). */
export const MIN_PROTOCOL_VERSION = 1;
export const UNSUPPORTED_PROTOCOL = 'UNSUPPORTED_PROTOCOL_VERSION';

/**
 * The protocol version spoken to the coordinators: the newest this client knows, stepped down
 * one version at a time when a coordinator refuses it (an older release answers a newer version
 * 400 `UNSUPPORTED_PROTOCOL_VERSION`), and down to what a newer coordinator answers in. Once
 * stepped down, the newest is tried again after `retryNewestMs` (the coordinators may have been
 * upgraded meanwhile). As the Python client's `Negotiation`.
 */
export class Negotiation {
  /** @param {{retryNewestMs?: number, now?: () => number}} [o] */
  constructor({ retryNewestMs = 300_000, now = () => Date.now() } = {}) {
    this.version = PROTOCOL_VERSION;
    this.retryNewestMs = retryNewestMs;
    this.now = now;
    /** @type {number|null} */
    this.steppedDownAt = null;
  }

  /** `body` with the version to speak now (a body without `protocolVersion` as it is).
   * @template T @param {T} body @returns {T} */
  stamp(body) {
    if (!body || typeof body !== 'object' || !('protocolVersion' in body)) return body;
    if (this.steppedDownAt !== null && this.now() - this.steppedDownAt >= this.retryNewestMs) {
      this.version = PROTOCOL_VERSION;
      this.steppedDownAt = null;
    }
    const requested = /** @type {any} */ (body).protocolVersion;
    if (Number.isInteger(requested) && requested > this.version) return { ...body, protocolVersion: this.version };
    return body;
  }

  /** Whether a refusal with `code` of `sent` means: speak an older version, send it again.
   * @param {string|undefined} code @param {any} sent */
  refused(code, sent) {
    const version = sent && typeof sent === 'object' ? sent.protocolVersion : undefined;
    if (code !== UNSUPPORTED_PROTOCOL || !Number.isInteger(version)) return false;
    if (version > this.version) return true; // sent before another request stepped down
    if (version !== this.version || version <= MIN_PROTOCOL_VERSION) return false;
    this.version -= 1;
    this.steppedDownAt = this.now();
    return true;
  }

  /** An answer names the version it is in (from version 2 on): speak no newer one. @param {any} data */
  answered(data) {
    const version = data && typeof data === 'object' ? data.protocolVersion : undefined;
    if (Number.isInteger(version) && version >= MIN_PROTOCOL_VERSION && version < this.version) {
      this.version = version;
      this.steppedDownAt = this.now();
    }
  }
}

export class CoordinatorError extends Error {
  /**
   * @param {string} message
   * @param {{status?: number, code?: string, url?: string, retryAfterMs?: number, body?: any}} [info]
   */
  constructor(message, info = {}) {
    super(message);
    this.name = this.constructor.name;
    this.status = info.status;
    this.code = info.code;
    this.url = info.url;
    this.retryAfterMs = info.retryAfterMs;
    this.body = info.body;
  }
}
/** 401 / 403: the credential is refused; the member or producer stops (M11). */
export class CoordinatorAuthError extends CoordinatorError {}
/** A refusal that does not end by itself (a client bug, an unsupported version). */
export class CoordinatorRejected extends CoordinatorError {}
/** No usable answer now: retry soon (within the lease). */
export class CoordinatorUnavailable extends CoordinatorError {}

/** Codes answered with a 4xx that end by themselves (M13). */
export const RETRIED_CODES = new Set(['UNKNOWN_STREAM', 'UNKNOWN_GROUP', 'INCARNATION_MISMATCH', 'DELETED', 'RATE_LIMITED', 'QUOTA_EXCEEDED']);

/**
 * Exponential backoff with full jitter.
 * @param {number} attempt 0, 1, 2...
 * @param {number} [baseMs]
 * @param {number} [capMs]
 */
export function backoffMs(attempt, baseMs = 100, capMs = 2000) {
  const top = Math.min(capMs, baseMs * 2 ** Math.min(attempt, 20));
  return top / 2 + Math.random() * (top / 2);
}

/** @param {string|null} value  Retry-After: seconds or an HTTP date. */
export function parseRetryAfter(value) {
  if (!value) return undefined;
  const s = Number(value);
  if (Number.isFinite(s)) return Math.max(0, s * 1000);
  const at = Date.parse(value);
  return Number.isFinite(at) ? Math.max(0, at - Date.now()) : undefined;
}

/**
 * @param {string | string[]} urls  one URL, several comma-separated, or an array
 * @returns {string[]}
 */
export function splitUrls(urls) {
  const list = (Array.isArray(urls) ? urls : String(urls).split(','))
    .map((u) => u.trim().replace(/\/+$/, ''))
    .filter(Boolean);
  if (!list.length) throw new Error('no coordinator URL');
  return list;
}

export class Coordinator {
  /**
   * @param {{urls: string | string[], token?: string, timeoutMs?: number, fetch?: typeof fetch}} options
   */
  constructor({ urls, token, timeoutMs = 10_000, fetch: fetchImpl }) {
    this.urls = splitUrls(urls);
    this.token = token || undefined;
    this.timeoutMs = timeoutMs;
    this.fetch = fetchImpl ?? globalThis.fetch;
    /** The URL that answered last: tried first. */
    this.current = 0;
    this.negotiation = new Negotiation();
    /** Requests sent (each URL tried counts once). */
    this.requests = 0;
  }

  /**
   * POST `body`, stamped with the protocol version to speak (and sent again one version older
   * when the coordinator refuses the version); the answer.
   * @param {string} path @param {object} body @param {{timeoutMs?: number}} [options]
   * @returns {Promise<any>}
   */
  async post(path, body, options = {}) {
    for (;;) {
      const sent = this.negotiation.stamp(body);
      try {
        const answer = await this.postRaw(path, sent, options);
        this.negotiation.answered(answer);
        return answer;
      } catch (err) {
        if (err instanceof CoordinatorRejected && this.negotiation.refused(err.code, sent)) continue;
        throw err;
      }
    }
  }

  /**
   * The heartbeats of one process's members in one request (`POST /v1/heartbeats`); per item
   * its answer or, for a refused item, a `CoordinatorRejected` (not thrown). The whole request
   * throws as `post` does, and `CoordinatorUnavailable` when the answer has not one response
   * per heartbeat.
   * @param {object[]} requests @param {{timeoutMs?: number}} [options]
   * @returns {Promise<(any|CoordinatorRejected)[]>}
   */
  async heartbeats(requests, options = {}) {
    /** @type {any[]} */
    let items;
    for (;;) {
      const sent = requests.map((r) => this.negotiation.stamp(r));
      const answer = await this.postRaw('/v1/heartbeats', { heartbeats: sent }, options);
      items = answer?.responses;
      if (!Array.isArray(items) || items.length !== requests.length) {
        throw new CoordinatorUnavailable('POST /v1/heartbeats: the answer has no response per heartbeat');
      }
      const refused = sent.filter((_, i) => items[i] && items[i].error === UNSUPPORTED_PROTOCOL);
      if (!(refused.length && this.negotiation.refused(UNSUPPORTED_PROTOCOL, refused[0]))) break;
    }
    for (const item of items) this.negotiation.answered(item);
    return items.map((item) => {
      if (!item || typeof item !== 'object' || !('error' in item)) return item;
      const status = Number.isInteger(item.status) ? item.status : 400;
      const message = `POST /v1/heartbeats item: ${status} ${item.error}${item.message ? ': ' + item.message : ''}`;
      const info = { status, code: String(item.error), body: item };
      if (status === 401 || status === 403) return new CoordinatorAuthError(message, info);
      if (status >= 500 || status === 408 || status === 429 || RETRIED_CODES.has(String(item.error))) {
        return new CoordinatorUnavailable(message, info);
      }
      return new CoordinatorRejected(message, info);
    });
  }

  /**
   * POST `body` to `path` as it is; each URL is tried once at most, from the one that answered last,
   * moving on after a refused connection, a timeout or a 502/503/504.
   * @param {string} path
   * @param {object} body
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<any>}
   */
  async postRaw(path, body, { timeoutMs } = {}) {
    const data = JSON.stringify(body);
    /** @type {CoordinatorError | undefined} */
    let last;
    for (let tried = 0; tried < this.urls.length; tried++) {
      const index = (this.current + tried) % this.urls.length;
      const url = this.urls[index] + path;
      try {
        const answer = await this.#once(url, data, timeoutMs ?? this.timeoutMs);
        this.current = index;
        return answer;
      } catch (err) {
        if (!(err instanceof CoordinatorUnavailable)) {
          this.current = index;
          throw err;
        }
        last = err;
        // Another coordinator may answer: a standby, a refused connection, a gateway error.
        if (!(err.status === undefined || err.status === 502 || err.status === 503 || err.status === 504)) {
          this.current = index;
          throw err;
        }
      }
    }
    throw last ?? new CoordinatorUnavailable('no coordinator answered');
  }

  /** @param {string} url @param {string} data @param {number} timeoutMs */
  async #once(url, data, timeoutMs) {
    this.requests += 1;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), Math.max(1, timeoutMs));
    /** @type {Record<string,string>} */
    const headers = { 'content-type': 'application/json', accept: 'application/json' };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    let response;
    let text;
    try {
      response = await this.fetch(url, { method: 'POST', headers, body: data, signal: controller.signal });
      text = await response.text();
    } catch (err) {
      const why = controller.signal.aborted ? `no answer within ${timeoutMs} ms` : describe(err);
      throw new CoordinatorUnavailable(`${url}: ${why}`, { url });
    } finally {
      clearTimeout(timer);
    }
    /** @type {any} */
    let json;
    try {
      json = text ? JSON.parse(text) : undefined;
    } catch {
      json = undefined;
    }
    const status = response.status;
    if (status >= 200 && status < 300) {
      if (json === undefined || typeof json !== 'object') {
        throw new CoordinatorUnavailable(`${url}: an answer that is not JSON (${status})`, { url, status });
      }
      return json;
    }
    const code = json && typeof json.error === 'string' ? json.error : undefined;
    const message = `${url}: ${status}${code ? ' ' + code : ''}${json?.message ? ': ' + json.message : ''}`;
    const info = { status, code, url, body: json, retryAfterMs: parseRetryAfter(response.headers.get('retry-after')) };
    if (status === 401 || status === 403) throw new CoordinatorAuthError(message, info);
    if (status >= 500 || status === 408 || status === 429 || (code && RETRIED_CODES.has(code))) {
      throw new CoordinatorUnavailable(message, info);
    }
    throw new CoordinatorRejected(message, info);
  }
}

/** @param {unknown} err */
function describe(err) {
  if (!(err instanceof Error)) return String(err);
  const cause = /** @type {any} */ (err).cause;
  return cause?.code ? `${err.message} (${cause.code})` : err.message;
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
  constructor(coordinator, { lingerMs = 5, maxBatch = 500, maxLongPolls = 32 } = {}) {
    this.coordinator = coordinator;
    this.lingerMs = lingerMs;
    this.maxBatch = maxBatch;
    this.maxLongPolls = maxLongPolls;
    this.longPolls = 0;
    this.batched = true;
    /** Batch requests sent. */
    this.batchesSent = 0;
    /** @type {{request: any, timeoutMs: number, resolve: (v: any) => void, reject: (e: any) => void}[]} */
    this.pending = [];
    /** @type {NodeJS.Timeout|null} */
    this.timer = null;
  }

  /** One member's answer. @param {any} request @param {{timeoutMs?: number}} [options] @returns {Promise<any>} */
  async heartbeat(request, { timeoutMs = this.coordinator.timeoutMs } = {}) {
    if (!this.batched) return this.coordinator.post('/v1/heartbeat', request, { timeoutMs });
    if (request.waitMs) {
      if (this.longPolls < this.maxLongPolls) {
        this.longPolls += 1;
        try {
          return await this.coordinator.post('/v1/heartbeat', request, { timeoutMs: timeoutMs + request.waitMs });
        } finally {
          this.longPolls -= 1;
        }
      }
      const { waitMs: _w, ...rest } = request;
      request = rest;
    }
    return new Promise((resolve, reject) => {
      this.pending.push({ request, timeoutMs, resolve, reject });
      const urgent = (request.revokedShards ?? []).length > 0;
      if (urgent || this.pending.length >= this.maxBatch) {
        this.#flush();
      } else if (!this.timer) {
        this.timer = setTimeout(() => this.#flush(), this.lingerMs);
      }
    });
  }

  async #flush() {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const slots = this.pending;
    this.pending = [];
    if (!slots.length) return;
    this.batchesSent += 1;
    /** @type {any[]} */
    let answers;
    try {
      answers = await this.coordinator.heartbeats(slots.map((s) => s.request),
        { timeoutMs: Math.min(...slots.map((s) => s.timeoutMs)) });
    } catch (err) {
      if (err instanceof CoordinatorRejected && (err.status === 404 || err.status === 405) &&
        !RETRIED_CODES.has(String(err.code))) {
        this.batched = false; // an older coordinator: single heartbeats
        for (const slot of slots) {
          this.coordinator.post('/v1/heartbeat', slot.request, { timeoutMs: slot.timeoutMs }).then(slot.resolve, slot.reject);
        }
        return;
      }
      for (const slot of slots) slot.reject(err);
      return;
    }
    slots.forEach((slot, i) => {
      if (answers[i] instanceof CoordinatorError) slot.reject(answers[i]);
      else slot.resolve(answers[i]);
    });
  }
}
