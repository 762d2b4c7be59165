import { afterAll, beforeAll, describe } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { MysqlLockBackend } from '../../lib/index.js';
import { emptyLockTables, useMariadbServer } from '../support/mariadb-fixture.js';
import { itKeepsEveryPromise, type RealStore } from './real-store.model.js';

// The random programs of the model on a real MariaDB and real time: its procedures' owner checks,
// line and hand-overs under the injected faults (see lock-service.redis.model.spec.ts).
describe('LockService on a real MariaDB against the model of its promises, with faulty calls', () => {
  const fixture = useMariadbServer();
  beforeAll(() => Logger.overrideLogger(false));
  afterAll(() => Logger.overrideLogger(['log', 'error', 'warn']));

  // Not in `npm test`: MODEL_RUNS_MYSQL cases (MODEL_SEED replays a run; see checkModelOn).
  const store: RealStore = {
    // The tables the backend made (it makes them on first use): emptied between cases.
    reset: () => emptyLockTables(fixture.admin),
    connect: () => new MysqlLockBackend(fixture.url),
    waiting: (store) => (store as unknown as { line: { watchers: Map<string, unknown> } }).line.watchers.size,
  };
  itKeepsEveryPromise('MariaDB', store, Number(process.env.MODEL_RUNS_MYSQL ?? 0));
});
