import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { LockLostError, LockNotAcquiredError, LockService } from 'nest-distributed-lock';
import { recordLocks } from 'nest-distributed-lock/testing';

/**
 * What docs/testing-your-app.md says of Jest's fake timers, held true. The library counts leases
 * and waits on performance.now() from node:perf_hooks, which Jest's fake timers leave alone, while
 * its timers (the watchdog's, a waiter's sleep) are the global setTimeout, which they fake.
 */

// Taken before any test installs fake timers: a pause in real time.
const realSetTimeout = globalThis.setTimeout;
const realSleep = (ms: number) => new Promise<void>((resolve) => realSetTimeout(resolve, ms));

/** Whether `promise` has settled, once pending callbacks had a real turn to run. */
async function settled(promise: Promise<unknown>): Promise<boolean> {
  let done = false;
  void promise.then(
    () => (done = true),
    () => (done = true),
  );
  await realSleep(20);
  return done;
}

const services: LockService[] = [];
function service(options?: ConstructorParameters<typeof LockService>[1]): LockService {
  const locks = new LockService(undefined, options);
  services.push(locks);
  return locks;
}

afterEach(async () => {
  jest.useRealTimers();
  await Promise.all(services.splice(0).map((locks) => locks.onApplicationShutdown()));
});

describe('under jest.useFakeTimers()', () => {
  it('what waits on no time works as in production: free locks, busy answers, skips, a waiter woken by a release', async () => {
    jest.useFakeTimers();
    const locks = service();
    await expect(locks.using('free', () => 'ran')).resolves.toBe('ran');

    const held = await locks.acquire('order:1');
    await expect(locks.acquire('order:1', { wait: 0 })).rejects.toBeInstanceOf(LockNotAcquiredError);
    await expect(locks.using('order:1', () => 'ran', { onBusy: 'skip' })).resolves.toBeUndefined();

    const waiter = locks.acquire('order:1', { wait: 10_000 });
    await held.release();
    const next = await waiter; // woken by the release: no timer involved
    expect(next.isHeld).toBe(true);
    await next.release();
  });

  it('advancing fake time ends no wait, expires no lease and runs no watchdog', async () => {
    jest.useFakeTimers();
    const locks = service(); // ttl 30 s: its first extension is due in 10 s of real time
    const recorder = recordLocks(locks);
    const held = await locks.acquire('order:1');
    const waiter = locks.acquire('order:1', { wait: 20_000 });

    await jest.advanceTimersByTimeAsync(120_000); // far past the wait, the ttl and every extension due
    expect(await settled(waiter)).toBe(false); // still waiting
    expect(held.isHeld).toBe(true);
    expect(recorder.events.filter((e) => e.type === 'extended' || e.type === 'lost')).toEqual([]);

    await held.release(); // what ends it here
    await (await waiter).release();
  });

  it('a lock held longer than its ttl in real time is lost: the watchdog runs on a faked timer', async () => {
    jest.useFakeTimers();
    const locks = service({ ttl: 200 });
    const held = await locks.acquire('order:1');
    await realSleep(300); // the extension due at about 67 ms never ran
    expect(held.isHeld).toBe(false);
    expect(held.signal.reason).toBeInstanceOf(LockLostError);
    expect((held.signal.reason as LockLostError).reason).toBe('expired');
  });
});

describe('after jest.useRealTimers()', () => {
  it('the watchdog runs again, though the timer it had under fake timers was dropped', async () => {
    jest.useFakeTimers();
    const before = service({ ttl: 200 });
    await (await before.acquire('order:1')).release(); // its watchdog's (fake) timer stays set, to fire for nothing
    jest.useRealTimers(); // drops that timer: it will never fire

    const locks = service({ ttl: 1_500 }); // due later than the dropped timer
    const recorder = recordLocks(locks);
    const held = await locks.acquire('order:2');
    await recorder.waitFor('extended', 'order:2', { timeoutMs: 10_000 }); // due 500 ms after the acquisition
    expect(held.isHeld).toBe(true);
    await held.release();
  });
});

describe('under jest.useFakeTimers({ advanceTimers: true })', () => {
  it('waits end and the watchdog extends, on real time', async () => {
    jest.useFakeTimers({ advanceTimers: true });
    const locks = service({ ttl: 1_500 });
    const recorder = recordLocks(locks);
    const held = await locks.acquire('order:1');

    const error = await locks.acquire('order:1', { wait: 150 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockNotAcquiredError);
    await recorder.waitFor('extended', 'order:1'); // due 500 ms after the acquisition
    expect(held.isHeld).toBe(true);
    await held.release();
  });
});
