// Prometheus metrics of the workers of a process, with prom-client: the Python worker's names and
// labels (rsc/client/worker_metrics.py), read from the workers at scrape time, plus the handler
// time histogram. `metrics.serve(port)` answers GET /metrics.
import { createServer } from 'node:http';
import client from 'prom-client';

const LABELS = /** @type {const} */ (['stream', 'group', 'member']);
const SHARD_LABELS = /** @type {const} */ (['stream', 'group', 'member', 'shard']);
/** The Python worker's buckets (seconds). */
export const HANDLER_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

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
  constructor({ registry, defaultMetrics = true } = {}) {
    this.registry = registry ?? new client.Registry();
    if (defaultMetrics) client.collectDefaultMetrics({ register: this.registry });
    /** @type {Set<Tracked>} */
    this.workers = new Set();
    this.handler = new client.Histogram({
      name: 'rsc_worker_handler_seconds', help: 'Time a handler took, failed calls included',
      labelNames: ['stream', 'group'], buckets: HANDLER_BUCKETS, registers: [this.registry],
    });
    const self = this;
    /** @param {string} name @param {string} help @param {(p: any) => number} value */
    const counter = (name, help, value) => new client.Counter({
      name, help, labelNames: LABELS, registers: [this.registry],
      collect() {
        this.reset();
        for (const [labels, poller] of self.#pollers()) this.inc(labels, value(poller));
      },
    });
    counter('rsc_worker_handled_total', 'Entries handled and acknowledged', (p) => p.handled);
    counter('rsc_worker_failed_total', 'Handler calls that raised (retried later)', (p) => p.failed);
    counter('rsc_worker_retried_total', 'Handler calls for entries delivered before (after a failure or a crash)',
      (p) => p.retried);
    counter('rsc_worker_dead_lettered_total', 'Entries moved to the dead-letter stream', (p) => p.deadLettered);
    counter('rsc_worker_stalls_total',
      'Shards found with entries waiting and no read for stall_after_s (read again, reported)', (p) => p.stalls);
    new client.Gauge({
      name: 'rsc_worker_owned_shards', help: 'Shards the member reads now', labelNames: LABELS,
      registers: [this.registry],
      collect() {
        this.reset();
        for (const [labels, , member] of self.#pollers()) this.set(labels, member?.machine.owned.size ?? 0);
      },
    });
    /** @param {string} name @param {string} help @param {'pending'|'lag'} field */
    const perShard = (name, help, field) => new client.Gauge({
      name, help, labelNames: SHARD_LABELS, registers: [this.registry],
      collect() {
        this.reset();
        for (const [labels, poller, member] of self.#pollers()) {
          for (const figure of poller.figures.values()) {
            if (!member?.machine.owned.has(figure.shard) || figure[field] === null) continue;
            this.set({ ...labels, shard: String(figure.shard) }, figure[field]);
          }
        }
      },
    });
    perShard('rsc_worker_shard_lag',
      'Entries not yet delivered to the member\'s group, per shard it owns (XINFO GROUPS, every reclaimEveryMs)', 'lag');
    perShard('rsc_worker_shard_pending', 'Entries read and not yet acknowledged, per shard it owns', 'pending');
  }

  /** Count this worker's figures (createWorker does it when given `metrics`). @param {Tracked} worker */
  track(worker) {
    this.workers.add(worker);
  }

  /** @param {Tracked} worker */
  untrack(worker) {
    this.workers.delete(worker);
  }

  /** One handler call took `seconds`. @param {string} stream @param {string} group @param {number} seconds */
  handlerSeconds(stream, group, seconds) {
    this.handler.observe({ stream, group }, seconds);
  }

  /** The exposition text. @returns {Promise<string>} */
  text() {
    return this.registry.metrics();
  }

  /**
   * Answer GET /metrics on `port` (0: any free port); resolves to the server once it listens.
   * @param {number} port @param {string} [host]
   * @returns {Promise<import('node:http').Server>}
   */
  serve(port, host = '0.0.0.0') {
    const server = createServer(async (req, res) => {
      if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
        return;
      }
      try {
        const body = await this.text();
        res.writeHead(200, { 'content-type': this.registry.contentType }).end(body);
      } catch (err) {
        res.writeHead(500, { 'content-type': 'text/plain' }).end(`${err}\n`);
      }
    });
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => resolve(server));
    });
  }

  /** @returns {Generator<[{stream: string, group: string, member: string}, any, any]>} */
  *#pollers() {
    for (const worker of this.workers) {
      if (!worker.poller) continue;
      yield [{ stream: worker.options.stream, group: worker.options.group, member: worker.memberId },
        worker.poller, worker.member];
    }
  }
}
