import { afterEach, describe, expect, it } from '@jest/globals';
import { LockService, MemoryLockBackend, type LockBackend, type LockHandle } from '../lib/index.js';
import { until } from './support/wait.js';

/** Lets every callback already due run: attempts started by a call or a wake-up have reached the store. */
const settle = () => new Promise((resolve) => setImmediate(resolve));
/** Lets time pass: what the scenario needs is a place in line older than the waiter's ttl. */
const elapse = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** A call still waiting when a test fails ends at shutdown: its rejection must not end the run. */
function pending<T>(promise: Promise<T>): Promise<T> {
  promise.catch(() => undefined);
  return promise;
}

/** The in-memory store, counting the attempts that reach it (no `immediate`: shared locks never take it). */
function countingBackend(inner = new MemoryLockBackend()): { backend: LockBackend; attempts: () => number } {
  let attempts = 0;
  const backend: LockBackend = {
    name: inner.name,
    fencing: inner.fencing,
    sharedHolders: inner.sharedHolders,
    tryAcquire: (...args) => (attempts++, inner.tryAcquire(...args)),
    extend: (...args) => inner.extend(...args),
    release: (...args) => inner.release(...args),
    inspect: (...args) => inner.inspect(...args),
    watch: (...args) => inner.watch(...args),
    watching: () => inner.watching(),
    close: () => inner.close(),
  };
  return { backend, attempts: () => attempts };
}

describe('shared locks and semaphores: fairness of the in-memory line', () => {
  const services: LockService[] = [];
  afterEach(async () => {
    await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
  });
  const service = (backend: LockBackend, options: ConstructorParameters<typeof LockService>[1] = {}) => {
    const s = new LockService(backend, options);
    services.push(s);
    return s;
  };

  it('keeps a queued writer ahead of later readers when its ttl is shorter than the pause between its polls', async () => {
    const locks = service(new MemoryLockBackend(), { pollInterval: 60_000 });
    const reader = await locks.acquire('doc', { mode: 'shared' });
    const writer = pending(locks.acquire('doc', { ttl: 500, wait: 20_000 }));
    await settle();
    // The writer is in line: a later reader waits for it.
    expect(await locks.tryAcquire('doc', { mode: 'shared' })).toBeUndefined();
    // Still waiting, longer than its own ttl; its next poll is a pollInterval away.
    await elapse(1_500);
    const late = await locks.tryAcquire('doc', { mode: 'shared' });
    await late?.release();
    expect(late).toBeUndefined();
    await reader.release();
    await (await writer).release();
  });

  it('keeps the place of a waiter that sleeps behind the head of its own process queue', async () => {
    const backend = new MemoryLockBackend();
    const [a, b] = [service(backend, { pollInterval: 10 }), service(backend, { pollInterval: 10 })];
    const reader = await a.acquire('doc', { mode: 'shared' });
    const order: string[] = [];
    const take = (locks: LockService, name: string, ttl?: number) =>
      pending(
        locks.acquire('doc', { wait: 20_000, ttl }).then(async (handle) => {
          order.push(name);
          await handle.release();
        }),
      );
    // w1 and w2 of one process try at once (both join the store's line); w3 of another comes after them.
    const w1 = take(a, 'w1');
    const w2 = take(a, 'w2', 100);
    await settle();
    const w3 = take(b, 'w3');
    await settle();
    // w2 waits longer than its ttl, asleep behind w1 (only the head of a process's queue polls).
    await elapse(400);
    await reader.release();
    await Promise.all([w1, w2, w3]);
    expect(order).toEqual(['w1', 'w2', 'w3']);
  });

  // A caller queued behind another of its process for the same key set makes no attempt (only the
  // head asks), so the store's line does not know it: a caller of this process on another key set
  // that includes the key must wait until it has asked, or it passes it in the store's line.
  it('does not let a reader of another key set of this process pass a writer queued here before it', async () => {
    const locks = service(new MemoryLockBackend(), { pollInterval: 60_000 });
    const holder = await locks.acquire('doc');
    const order: string[] = [];
    const take = (name: string, keys: string[], mode?: 'shared') =>
      pending(locks.acquire(keys, { wait: 20_000, mode }).then((handle) => (order.push(name), handle)));
    const r1 = take('r1', ['doc'], 'shared');
    await settle();
    const w = take('w', ['doc']);
    await settle();
    // A reader that came after the writer, on 'doc' and another key.
    const r2 = take('r2', ['doc', 'toc'], 'shared');
    await settle();
    await holder.release();
    const first = await r1;
    await settle();
    await settle();
    // The writer is next: the later reader does not enter beside r1.
    expect(order).toEqual(['r1']);
    await first.release();
    await (await w).release();
    await (await r2).release();
    expect(order).toEqual(['r1', 'w', 'r2']);
  });

  // A caller of several keys that waits for one of them must not keep others out of the keys it
  // cannot take yet: a holder of 'a' asking for 'b' next (sorted order, as the reentrancy rules
  // ask) would wait behind it while it waits for 'a', and both would wait until a wait runs out.
  it('lets a holder take its next key in sorted order while a caller of both keys waits for the first', async () => {
    const locks = service(new MemoryLockBackend(), { pollInterval: 60_000 });
    let entered!: () => void;
    let go!: () => void;
    const inA = new Promise<void>((resolve) => (entered = resolve));
    const proceed = new Promise<void>((resolve) => (go = resolve));
    const outer = pending(
      locks.using('a', async () => {
        entered();
        await proceed;
        return locks.using('b', () => 'nested', { wait: 2_000 });
      }),
    );
    await inA;
    // Another caller asks for both keys: it waits for 'a' (and has a place in the line of 'b').
    const both = pending(locks.acquire(['a', 'b'], { wait: 20_000 }));
    await settle();
    go();
    expect(await outer).toBe('nested');
    await (await both).release();
  });

  it("wakes only the one waiter that gets a semaphore's freed permit", async () => {
    const { backend, attempts } = countingBackend();
    const locks = service(backend, { pollInterval: 60_000 });
    const holders = [
      await locks.acquire('sem', { permits: 3 }),
      await locks.acquire('sem', { permits: 3 }),
      await locks.acquire('sem', { permits: 3 }),
    ];
    const entered: LockHandle[] = [];
    let finishing = false;
    const waiting = Array.from({ length: 6 }, () =>
      pending(
        locks.acquire('sem', { permits: 3, wait: 20_000 }).then(async (h) => {
          entered.push(h);
          if (finishing) await h.release();
        }),
      ),
    );
    await settle();
    await until(() => locks.queue.waiting === 6, 5_000, 'six waiters');
    await settle();
    const before = attempts();
    await holders[0].release();
    await until(() => entered.length === 1, 5_000, 'one waiter to enter');
    await settle();
    await settle();
    expect(attempts() - before).toBe(1);
    // Every waiter enters in turn, once the permits are given back.
    finishing = true;
    for (const h of [...holders.slice(1), ...entered]) await h.release();
    await Promise.all(waiting);
    expect(entered).toHaveLength(6);
  });

  it('does not wake a queued writer while readers still hold the key', async () => {
    const { backend, attempts } = countingBackend();
    const locks = service(backend, { pollInterval: 60_000 });
    const readers = [await locks.acquire('doc', { mode: 'shared' }), await locks.acquire('doc', { mode: 'shared' })];
    const writer = pending(locks.acquire('doc', { wait: 20_000 }));
    await settle();
    await settle();
    const before = attempts();
    await readers[0].release();
    await settle();
    await settle();
    expect(attempts() - before).toBe(0);
    await readers[1].release();
    await (await writer).release();
  });

  it('leaves nothing held or queued in the store after waiters gave up, were aborted, timed out or were shut down', async () => {
    const backend = new MemoryLockBackend();
    const locks = service(backend, { pollInterval: 60_000 });
    // Another service of the process on the same store, shut down alone (the store stays open).
    const { backend: shared } = countingBackend(backend);
    const other = new LockService({ ...shared, close: undefined }, { pollInterval: 60_000 });
    const writer = await locks.acquire('doc');
    const aborted = new AbortController();
    const calls = [
      locks.acquire('doc', { mode: 'shared', wait: 20_000, signal: aborted.signal }),
      locks.acquire('doc', { mode: 'shared', wait: 50 }),
      locks.acquire(['doc', 'toc'], { permits: 2, wait: 50 }),
      other.acquire('doc', { mode: 'shared', wait: 20_000 }),
      other.acquire(['doc', 'toc'], { mode: 'shared', wait: 20_000 }),
    ].map((call) =>
      call.then(
        () => 'acquired',
        (error: unknown) => (error as Error).name,
      ),
    );
    await settle();
    aborted.abort();
    await other.onApplicationShutdown();
    expect(await Promise.all(calls)).toEqual([
      'AbortError',
      'LockNotAcquiredError',
      'LockNotAcquiredError',
      'LockBackendError',
      'LockBackendError',
    ]);
    await writer.release();
    expect(await backend.inspect('lock:doc')).toBeUndefined();
    expect(backend.footprint).toEqual({ keys: 0, watchedKeys: 0 });
  });
});
