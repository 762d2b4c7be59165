import { afterAll, beforeAll, describe, it } from '@jest/globals';
import { Logger } from '@nestjs/common';
import fc from 'fast-check';
import * as lib from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { run, scenario } from './lock-service.model.js';
import { runningTimeClock } from '../support/running-time.clock.js';

// The same random programs as on fake time, on a real redis-server and real time: the Redis
// backend's line, hand-overs and late answers under the same injected faults. Fewer cases, as each
// takes real milliseconds; a failure prints its seed, and replays the program (not its timing).
// Waits are bounded on the time this process could run (see runningTimeClock).
describe('LockService on a real Redis against the model of its promises, with faulty calls', () => {
  const fixture = useRedisServer();
  beforeAll(() => Logger.overrideLogger(false));
  afterAll(() => Logger.overrideLogger(['log', 'error', 'warn']));

  // Not in `npm test`: each case takes real time. Run it with `npm run test:model:redis`
  // (MODEL_RUNS_REDIS cases; MODEL_SEED replays a run). It stops at the first failing case, then
  // shrinks that case for at most SHRINK_MS: each step of shrinking replays a program in real time,
  // so unbounded shrinking can outlast a CI job and report nothing. The seed comes first, so even a
  // run that is killed says how to replay it.
  const runs = Number(process.env.MODEL_RUNS_REDIS ?? 0);
  const seed = Number(process.env.MODEL_SEED ?? Math.floor(Math.random() * 2 ** 31));
  const SHRINK_MS = 60_000;
  (runs > 0 ? it : it.skip)(
    'keeps every promise on random programs of two processes over one Redis',
    async () => {
      process.stderr.write(`Model on a real Redis: ${runs} cases, seed ${seed} (replay: MODEL_SEED=${seed})\n`);
      const property = fc.asyncProperty(scenario, async (s) => {
        await fixture.admin.flushall();
        const store = new lib.RedisLockBackend(fixture.server.url);
        const waiting = () => (store as unknown as { line: { wakers: Map<string, unknown> } }).line.wakers.size;
        const clock = runningTimeClock(500);
        try {
          const violations = await run(lib, clock, s, store, waiting);
          if (violations.length > 0) throw new Error(violations.slice(0, 5).join('\n'));
        } finally {
          clock.stop();
          await store.close();
        }
      });
      const found = await fc.check(property, { numRuns: runs, seed, endOnFailure: true });
      if (!found.failed) return;
      // From the failing case (its path), shrinking only: what is smallest when time runs out.
      const shrunk = await fc.check(property, {
        seed,
        path: found.counterexamplePath ?? undefined,
        plugins: [fc.interruptAfterTimeLimit(SHRINK_MS)],
      });
      const replay = shrunk.failed
        ? `It failed again when replayed; shrinking found ${shrunk.numShrinks} smaller failing case(s)` +
          `${shrunk.interrupted ? ` before its ${SHRINK_MS / 1000} s ran out` : ''}. The smallest:`
        : 'It passed when replayed (its timing did not repeat). The case:';
      const smallest = shrunk.failed ? shrunk : found;
      throw new Error(
        `${fc.defaultReportMessage(found)}\n\n${replay} ${fc.stringify(smallest.counterexample)} (path ${smallest.counterexamplePath})\n` +
          String((smallest.errorInstance as Error | undefined)?.message ?? ''),
      );
    },
    // Cases take about 0.3 s each on an idle machine; shrinking is bounded above.
    runs * 3_000 + SHRINK_MS + 30_000,
  );
});
