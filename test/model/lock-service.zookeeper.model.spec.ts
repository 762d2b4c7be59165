import { afterAll, beforeAll, describe } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { ZooKeeperLockBackend } from '../../lib/backends/zookeeper/zookeeper.backend.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';
import { itKeepsEveryPromise, type RealStore } from './real-store.model.js';

// The random programs of the model on a real ZooKeeper (one server) and real time: its lines of
// sequential nodes, their expiries and hand-overs under the injected faults (see
// lock-service.redis.model.spec.ts).
describe('LockService on a real ZooKeeper against the model of its promises, with faulty calls', () => {
  const fixture = useZooKeeper();
  beforeAll(() => Logger.overrideLogger(false));
  afterAll(() => Logger.overrideLogger(['log', 'error', 'warn']));

  // Not in `npm test`: MODEL_RUNS_ZOOKEEPER cases (MODEL_SEED replays a run; see checkModelOn).
  let cases = 0;
  const store: RealStore = {
    // Each case gets a lock root of its own, never used before: an empty store.
    reset: async () => void cases++,
    connect: () => new ZooKeeperLockBackend(fixture.connectionString, { root: `${fixture.root}-${cases}` }),
    // Requests whose caller still waits to be woken by this process's watches.
    waiting: (store) =>
      [...(store as unknown as { requests: { all(): Iterable<{ waker?: unknown }> } }).requests.all()].filter((r) => r.waker).length,
  };
  itKeepsEveryPromise('ZooKeeper', store, Number(process.env.MODEL_RUNS_ZOOKEEPER ?? 0));
});
