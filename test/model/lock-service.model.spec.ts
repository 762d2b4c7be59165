import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import fc from 'fast-check';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import { run, scenario, sharedScenario, type Clock } from './lock-service.model.js';

// The library reads time from node:perf_hooks, which Jest's fake timers do not reach: point it at
// the global performance, which they replace, so that leases, waits and the store share one clock
// that only the test moves. Every case then replays exactly from its seed.
jest.unstable_mockModule('node:perf_hooks', () => ({ performance: { now: () => globalThis.performance.now() } }));
const lib = await import('../../lib/index.js');
const { MemoryLockBackend } = lib;

const fakeTime: Clock = {
  now: () => globalThis.performance.now(),
  async drive(work) {
    let done = false;
    void work.then(
      () => (done = true),
      () => (done = true),
    );
    for (let t = 0; !done && t < 20_000; t++) await jest.advanceTimersByTimeAsync(1);
    return done;
  },
  async timersLeft() {
    await jest.advanceTimersByTimeAsync(120_000);
    return jest.getTimerCount();
  },
  slackMs: 0,
};

function memoryStore(): { store: LockBackend; watchers: () => number } {
  const store = new MemoryLockBackend();
  return { store, watchers: () => (store as unknown as { watchers: Map<string, unknown> }).watchers.size };
}

function property(makeStore: () => { store: LockBackend; watchers: () => number }, faulty = true, shared = false) {
  return fc.asyncProperty(shared ? sharedScenario : scenario, async (s) => {
    jest.useFakeTimers({ now: 0, doNotFake: ['nextTick', 'setImmediate', 'queueMicrotask'] });
    try {
      const { store, watchers } = makeStore();
      // Without faults, attempts reach the store in the order of the calls: no waiter may be passed.
      const violations = await run(lib, fakeTime, s, store, watchers, { faulty, fifo: shared && !faulty });
      if (violations.length > 0) throw new Error(violations.slice(0, 5).join('\n'));
    } finally {
      jest.useRealTimers();
    }
  });
}

/** A store that frees a key for whoever asks: the owner check a release must make, left out. */
function releaseWithoutOwnerCheck(): { store: LockBackend; watchers: () => number } {
  const { store: inner, watchers } = memoryStore();
  const store: LockBackend = Object.assign(Object.create(null) as object, {
    name: 'broken',
    fencing: true,
    tryAcquire: inner.tryAcquire.bind(inner),
    extend: inner.extend.bind(inner),
    inspect: inner.inspect.bind(inner),
    watch: inner.watch!.bind(inner),
    release: async (keys: readonly string[]) => {
      for (const key of keys) {
        const holder = (await inner.inspect(key))?.owner;
        if (holder) await inner.release([key], holder);
      }
      return true;
    },
  });
  return { store, watchers };
}

/** A store whose tokens never increase. */
function tokenWithoutIncrement(): { store: LockBackend; watchers: () => number } {
  const { store: inner, watchers } = memoryStore();
  const store: LockBackend = Object.assign(Object.create(null) as object, {
    name: 'broken',
    fencing: true,
    tryAcquire: async (...args: Parameters<LockBackend['tryAcquire']>) => {
      const result = await inner.tryAcquire(...args);
      return result.acquired ? { ...result, fencingToken: 1 } : result;
    },
    extend: inner.extend.bind(inner),
    inspect: inner.inspect.bind(inner),
    watch: inner.watch!.bind(inner),
    release: inner.release.bind(inner),
  });
  return { store, watchers };
}

/** MODEL_SEED (and MODEL_PATH) from a failure's report replay that case, and only it. */
const replay = process.env.MODEL_SEED ? { seed: Number(process.env.MODEL_SEED), path: process.env.MODEL_PATH, endOnFailure: true } : {};

describe('LockService against a model of its promises, with faulty store calls', () => {
  // Thousands of lost locks are the point here; their warnings would bury the report.
  beforeAll(() => Logger.overrideLogger(false));
  afterAll(() => Logger.overrideLogger(['log', 'error', 'warn']));
  afterEach(() => {
    jest.useRealTimers();
  });

  it('keeps every promise on random programs of two processes over one store', async () => {
    // A failure prints the seed and path: fc.assert(property, { seed, path }) replays it.
    await fc.assert(property(memoryStore), { numRuns: Number(process.env.MODEL_RUNS ?? 300), ...replay });
  }, 120_000);

  // MODEL_SEEDS=1,2: the same programs from each seed, a test each (as the mutation runs use them).
  for (const seed of process.env.MODEL_SEEDS?.split(',').map(Number) ?? []) {
    it(`keeps every promise on random programs of two processes over one store, seed ${seed}`, async () => {
      await fc.assert(property(memoryStore), { numRuns: Number(process.env.MODEL_RUNS ?? 300), seed, endOnFailure: true });
    }, 120_000);
  }

  it('keeps every promise when the services call the in-memory store directly (answers without a promise)', async () => {
    // The two services stand for two processes: one shutting down must not empty the other's store.
    const sharedStore = () => {
      const made = memoryStore();
      made.store.close = async () => undefined;
      return made;
    };
    await fc.assert(property(sharedStore, false), { numRuns: Number(process.env.MODEL_RUNS ?? 300) });
  }, 120_000);

  it('keeps every promise with shared locks and semaphores, with faulty store calls', async () => {
    await fc.assert(property(memoryStore, true, true), { numRuns: Number(process.env.MODEL_RUNS ?? 300), ...replay });
  }, 120_000);

  /** One in-memory store that two services share (one shutting down does not empty it for the other). */
  const sharedStore = () => {
    const made = memoryStore();
    made.store.close = async () => undefined;
    return made;
  };

  it('keeps every promise with shared locks and semaphores on the store called directly, and passes no waiter', async () => {
    await fc.assert(property(sharedStore, false, true), { numRuns: Number(process.env.MODEL_RUNS ?? 300), ...replay });
  }, 120_000);

  for (const seed of process.env.MODEL_SEEDS?.split(',').map(Number) ?? []) {
    it(`keeps every promise with shared locks and semaphores on the store called directly, and passes no waiter, seed ${seed}`, async () => {
      await fc.assert(property(sharedStore, false, true), { numRuns: Number(process.env.MODEL_RUNS ?? 300), seed, endOnFailure: true });
    }, 120_000);
  }

  it.each([
    ['a release without its owner check', releaseWithoutOwnerCheck],
    ['a token that does not increase', tokenWithoutIncrement],
  ])(
    'finds %s, and shrinks it to a small case',
    async (_what, broken) => {
      const result = await fc.check(property(broken), { numRuns: 300, seed: 42 });
      expect(result.failed).toBe(true);
      console.log(fc.defaultReportMessage(result));
    },
    120_000,
  );
});
