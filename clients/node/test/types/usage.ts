// Typed use of the public API, compiled (never run) by `npm test` against the declarations the
// package publishes (types/, through the package's exports map): a change that breaks a typed
// user's code fails here.
import {
  createProducer, createWorker, route, WorkerMetrics, Coordinator, HeartbeatBatcher, CoordinatorRejected,
  ProducerFenced, ShardFull, PROTOCOL_VERSION, MIN_PROTOCOL_VERSION, enableTracing,
  type Message, type WorkerOptions, type PollerSettings,
} from 'rsc-client';
import { jump } from 'rsc-client/routing';
import { WorkerMetrics as Metrics } from 'rsc-client/metrics';

const metrics: Metrics = new WorkerMetrics({ defaultMetrics: false });
const settings: PollerSettings = { batch: 100, wakeBlockMs: 5000, reclaimEveryMs: 5000 };
const options: WorkerOptions = {
  coordinatorUrl: ['http://a:8080', 'http://b:8080'],
  redisUrl: 'redis://127.0.0.1:6379',
  stream: 'orders',
  group: 'billing',
  concurrency: 4,
  poller: settings,
  metrics,
  handler: async (message: Message, { signal }: { signal: AbortSignal }) => {
    const id: string = message.id;
    const shard: number = message.shard;
    const fields: Record<string, string> = message.fields;
    if (signal.aborted) throw new Error(`${id} ${shard} ${fields.k}`);
  },
};
const worker = createWorker(options);
const started: Promise<unknown> = worker.start();
const stopped: Promise<void> = worker.stop();
const done: Promise<void> = worker.done;

const producer = createProducer({ coordinatorUrl: 'http://a:8080', stream: 'orders' });
const id: Promise<string> = producer.publish('customer-1', { amount: '10' });
const ids: Promise<string[]> = producer.publishMany([{ key: 'k', fields: { a: '1' } }]);
const closed: Promise<void> = producer.close();

const shard: number = jump(12345n, 8);
const routed: number = route({ shards: [{ index: 0, key: 'k', state: 'ACTIVE' }] }, 'customer-1').index;
const coordinator = new Coordinator({ urls: 'http://a:8080', token: 't' });
const batcher = new HeartbeatBatcher(coordinator, { lingerMs: 5 });
const versions: number[] = [PROTOCOL_VERSION, MIN_PROTOCOL_VERSION, coordinator.negotiation.version];
const text: Promise<string> = metrics.text();
const errors: unknown[] = [CoordinatorRejected, ProducerFenced, ShardFull, enableTracing, batcher];

export { started, stopped, done, id, ids, closed, shard, routed, versions, text, errors };
