// The coordinator over HTTP (fetch): JSON bodies, a bearer token, several coordinator URLs
// (a standby's answers 503 STANDBY: the next is tried), Retry-After on 429/503.
//
// Errors, as the member and the producer treat them (docs/protocol.md, Errors; M11-M13):
//   CoordinatorAuthError     401/403: stop for good, never retry with this credential
//   CoordinatorRejected      another refusal that will not end by itself (400...): stop
//   CoordinatorUnavailable   no answer, a 5xx, 408, 429, 404 UNKNOWN_STREAM/GROUP,
//                            409 INCARNATION_MISMATCH/DELETED: retry (retryAfterMs when given)

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
  }

  /**
   * POST `body` to `path`; each URL is tried once at most, from the one that answered last,
   * moving on after a refused connection, a timeout or a 502/503/504.
   * @param {string} path
   * @param {object} body
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<any>}
   */
  async post(path, body, { timeoutMs } = {}) {
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
