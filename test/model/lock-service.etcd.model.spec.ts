import { afterAll, beforeAll, describe } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { EtcdLockBackend } from '../../lib/backends/etcd/etcd.backend.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { itKeepsEveryPromise, type RealStore } from './real-store.model.js';

// The random programs of the model on a real etcd (one member) and real time: its line, leases and
// hand-overs under the injected faults (see lock-service.redis.model.spec.ts).
describe('LockService on a real etcd against the model of its promises, with faulty calls', () => {
  const fixture = useEtcdCluster({ members: 1 });
  beforeAll(() => Logger.overrideLogger(false));
  afterAll(() => Logger.overrideLogger(['log', 'error', 'warn']));

  // Not in `npm test`: MODEL_RUNS_ETCD cases (MODEL_SEED replays a run; see checkModelOn).
  const store: RealStore = {
    reset: async () => void (await fixture.admin.delete().all()),
    connect: () => new EtcdLockBackend(fixture.endpoints[0]),
    // Its waiters end with their wait; none is tracked past the case.
    waiting: () => 0,
    // An acquisition is several requests of the backend's own: one given up on never goes on beside
    // the owner's next attempt (the service sends that after the first one's answer or error).
    attemptsInOrder: true,
  };
  itKeepsEveryPromise('etcd', store, Number(process.env.MODEL_RUNS_ETCD ?? 0));
});
