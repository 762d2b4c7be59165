import { describe, expect, it } from '@jest/globals';
import { setTimeout as sleep } from 'node:timers/promises';
import { LockNotAcquiredError, LockService, MemoryLockBackend } from '../lib/index.js';

/** A small seeded generator, so a failure can be replayed. */
function random(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const nothingKept = { leases: 0, requests: 0, keySets: 0, countedKeys: 0, scheduled: 0 };

/**
 * Memory must follow the locks held and waited for now, not every key ever used: a service that
 * kept a little per key would grow without end on ids (orders, users) that are each locked once.
 */
describe('what the service and the in-memory backend keep after many keys', () => {
  it('nothing per key once every lock is released, waited for, timed out or aborted', async () => {
    const backend = new MemoryLockBackend();
    const locks = new LockService(backend, { wait: 2_000, maxWaitersPerKey: 100 });
    const next = random(20);
    const distinct = 20_000;
    const key = () => `item:${Math.floor(next() * distinct)}`;

    // Uncontended calls of every kind over many keys, 32 callers at a time.
    const kinds = [
      () => locks.using(key(), () => 'done'),
      async () => (await locks.acquire(key())).release(),
      async () => (await locks.tryAcquire(key()))?.release(),
      () => locks.using([key(), key()], () => 'both'),
      () => locks.using(key(), () => locks.using(key(), () => 'nested')),
    ];
    const worker = async () => {
      for (let i = 0; i < 1_000; i++) await kinds[Math.floor(next() * kinds.length)]();
    };
    await Promise.all(Array.from({ length: 32 }, worker));

    // Contended keys: waiters that get the lock, that time out, and that give up on an abort.
    const held = await Promise.all(Array.from({ length: 200 }, (_, i) => locks.acquire(`hot:${i}`)));
    const giveUp = new AbortController();
    const waits = held.flatMap((_, i) => [
      // Waits that outlast any load: with the service's 2 s, a CI machine busy enough to stall this
      // process for 2.5 s (a garbage collection of the keys above, at a third of a core) timed out
      // the waiters that get the lock after its holder, and those that give up on the abort.
      locks.using(`hot:${i}`, () => 'after the holder', { wait: 60_000 }),
      locks.using(`hot:${i}`, () => 'never', { wait: 1 }).catch((error: unknown) => error),
      locks.using(`hot:${i}`, () => 'never', { signal: giveUp.signal, wait: 60_000 }).catch((error: unknown) => error),
    ]);
    await sleep(20);
    giveUp.abort();
    await Promise.all(held.map((handle) => handle.release()));
    const outcomes = await Promise.all(waits);
    expect(outcomes.filter((o) => o === 'after the holder')).toHaveLength(200);
    expect(outcomes.filter((o) => o instanceof LockNotAcquiredError)).toHaveLength(200);

    expect(locks.footprint()).toEqual(nothingKept);
    expect(backend.footprint).toEqual({ keys: 0, watchedKeys: 0 });
    await locks.onApplicationShutdown();
  });

  it('leases that ran out instead of being released (minHold) are dropped as more keys are used', async () => {
    const backend = new MemoryLockBackend();
    const locks = new LockService(backend);
    for (let i = 0; i < 5_000; i++) await locks.using(`kept:${i}`, () => 'done', { minHold: 1 });
    await sleep(5);
    for (let i = 0; i < 5_000; i++) await locks.using(`next:${i}`, () => 'done');
    expect(locks.footprint()).toEqual(nothingKept);
    // At most what the backend lets accumulate before it sweeps (1 024 keys), not the 5 000 kept.
    expect(backend.footprint.keys).toBeLessThanOrEqual(1_024);
    await locks.onApplicationShutdown();
  });
});
