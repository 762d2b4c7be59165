import { afterAll, beforeAll, describe } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { PostgresLockBackend } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { itKeepsEveryPromise, type RealStore } from './real-store.model.js';

// The random programs of the model on a real PostgreSQL and real time: its functions' owner
// checks, line and hand-overs under the injected faults (see lock-service.redis.model.spec.ts).
describe('LockService on a real PostgreSQL against the model of its promises, with faulty calls', () => {
  const fixture = usePostgresServer();
  beforeAll(() => Logger.overrideLogger(false));
  afterAll(() => Logger.overrideLogger(['log', 'error', 'warn']));

  // Not in `npm test`: MODEL_RUNS_POSTGRES cases (MODEL_SEED replays a run; see checkModelOn).
  const store: RealStore = {
    reset: async () => {
      // The tables the backend made (it makes them on first use): emptied between cases.
      const { rows } = await fixture.admin.query<{ name: string }>(
        `SELECT format('%I.%I', n.nspname, c.relname) AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.relkind = 'r' AND obj_description(c.oid, 'pg_class') LIKE 'nest-distributed-lock%'`,
      );
      for (const { name } of rows) await fixture.admin.query(`TRUNCATE ${name}, ${name}_waiters`);
    },
    connect: () => new PostgresLockBackend(fixture.url),
    waiting: (store) => (store as unknown as { line: { wakers: Map<string, unknown> } }).line.wakers.size,
  };
  itKeepsEveryPromise('PostgreSQL', store, Number(process.env.MODEL_RUNS_POSTGRES ?? 0));
});
