import { afterAll, beforeAll, describe } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { RedisLockBackend } from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { itKeepsEveryPromise, type RealStore } from './real-store.model.js';

// The same random programs as on fake time, on a real redis-server and real time: the Redis
// backend's line, hand-overs and late answers under the same injected faults. Fewer cases, as each
// takes real milliseconds; a failure prints its seed, and replays the program (not its timing).
// Waits are bounded on the time this process could run (see runningTimeClock).
describe('LockService on a real Redis against the model of its promises, with faulty calls', () => {
  const fixture = useRedisServer();
  beforeAll(() => Logger.overrideLogger(false));
  afterAll(() => Logger.overrideLogger(['log', 'error', 'warn']));

  // Not in `npm test`: each case takes real time. Run it with `npm run test:model:redis`
  // (MODEL_RUNS_REDIS cases; MODEL_SEED replays a run; see checkModelOn).
  const store: RealStore = {
    reset: async () => void (await fixture.admin.flushall()),
    connect: () => new RedisLockBackend(fixture.server.url),
    waiting: (store) => (store as unknown as { line: { wakers: Map<string, unknown> } }).line.wakers.size,
  };
  itKeepsEveryPromise('Redis', store, Number(process.env.MODEL_RUNS_REDIS ?? 0));
});
