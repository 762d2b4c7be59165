import { it } from '@jest/globals';
import fc from 'fast-check';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import * as lib from '../../lib/index.js';
import { runningTimeClock } from '../support/running-time.clock.js';
import { run, scenario, sharedScenario, type Scenario } from './lock-service.model.js';

/**
 * The random programs of the model on a real store and real time, as `npm run test:model:redis`
 * runs them: MODEL_RUNS_<STORE> cases (none by default: each takes real time), MODEL_SEED replays
 * a run. It stops at the first failing case, then shrinks that case for at most MODEL_SHRINK_MS
 * (60 s; 0 skips it): each step of shrinking replays a program in real time, so unbounded
 * shrinking can outlast a CI job and report nothing. The seed is printed first, so even a run that
 * is killed says how to replay it.
 */
export interface RealStore {
  /** Empties the store before a case. */
  reset(): Promise<void>;
  /** A new backend on the store, closed after its case. */
  connect(): LockBackend;
  /** Waiters the backend still tracks (none may be left once a case ended). */
  waiting(backend: LockBackend): number;
  /** An owner's attempts are applied one after another (FaultyBackend's `attemptsInOrder`). */
  attemptsInOrder?: boolean;
}

export const SHRINK_MS = Number(process.env.MODEL_SHRINK_MS ?? 60_000);

/** How long a test of `runs` cases may take: cases take about 0.3 s each on an idle machine. */
export function modelTimeout(runs: number): number {
  return runs * 3_000 + SHRINK_MS + 30_000;
}

/** The seeds of MODEL_SEEDS=1,2 (one test each), else none. */
export const modelSeeds = (): number[] => process.env.MODEL_SEEDS?.split(',').map(Number) ?? [];

/** The model's programs: of exclusive locks, or of read/write locks and a semaphore. */
export type Programs = 'exclusive' | 'shared';
const PROGRAMS: Record<Programs, { scenario: fc.Arbitrary<Scenario>; what: string }> = {
  exclusive: { scenario, what: 'two processes' },
  shared: { scenario: sharedScenario, what: 'shared locks and semaphores of two processes' },
};

/**
 * The tests of a real store's spec: for each kind of program, one test of `runs` cases (skipped
 * when `runs` is 0, as in `npm test`), and with MODEL_SEEDS=1,2 one test per seed of the same
 * programs (the mutation runs select these by title: see scripts/mutants/mutants.mjs).
 */
export function itKeepsEveryPromise(name: string, store: RealStore, runs: number): void {
  for (const [programs, { what }] of Object.entries(PROGRAMS) as [Programs, (typeof PROGRAMS)[Programs]][]) {
    const title = `keeps every promise on random programs of ${what} over one ${name}`;
    (runs > 0 ? it : it.skip)(title, () => checkModelOn(name, store, runs, { programs }), modelTimeout(runs));
    for (const seed of runs > 0 ? modelSeeds() : [])
      it(`${title}, seed ${seed}`, () => checkModelOn(name, store, runs, { programs, seed }), modelTimeout(runs));
  }
}

export async function checkModelOn(
  name: string,
  store: RealStore,
  runs: number,
  {
    programs = 'exclusive',
    seed = Number(process.env.MODEL_SEED ?? Math.floor(Math.random() * 2 ** 31)),
  }: { programs?: Programs; seed?: number } = {},
): Promise<void> {
  process.stderr.write(`Model (${programs} programs) on a real ${name}: ${runs} cases, seed ${seed} (replay: MODEL_SEED=${seed})\n`);
  const property = fc.asyncProperty(PROGRAMS[programs].scenario, async (s) => {
    await store.reset();
    const backend = store.connect();
    const clock = runningTimeClock(500);
    try {
      // MODEL_WAIT_BOUNDS=off: safety only, for a machine so loaded that real-time waits overrun.
      const violations = await run(lib, clock, s, backend, () => store.waiting(backend), {
        waitBounds: process.env.MODEL_WAIT_BOUNDS !== 'off',
        attemptsInOrder: store.attemptsInOrder,
      });
      if (violations.length > 0) throw new Error(violations.slice(0, 5).join('\n'));
    } finally {
      clock.stop();
      await backend.close?.();
    }
  });
  const found = await fc.check(property, { numRuns: runs, seed, endOnFailure: true });
  if (!found.failed) return;
  if (SHRINK_MS <= 0)
    throw new Error(`${fc.defaultReportMessage(found)}\n${String((found.errorInstance as Error | undefined)?.message ?? '')}`);
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
}
