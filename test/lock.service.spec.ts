import { afterEach, describe, expect, it } from '@jest/globals';
import { LockBackendError, LockLostError, LockNotAcquiredError, LockService, MemoryLockBackend, type LockBackend } from '../lib/index.js';
import { activeTimers, eventually } from './support/wait.js';

describe('LockService and LockHandle', () => {
  let locks: LockService;
  afterEach(async () => {
    await locks?.onApplicationShutdown();
  });

  it('exposes keys, fencing token, expiry and a live signal on the handle', async () => {
    locks = new LockService();
    const before = Date.now();
    const handle = await locks.acquire(['b', 'a'], { ttl: 5_000 });
    expect(handle.keys).toEqual(['lock:a', 'lock:b']);
    expect(handle.fencingToken).toEqual(expect.any(Number));
    expect(handle.expiresAt.getTime()).toBeGreaterThanOrEqual(before + 4_900);
    expect(handle.expiresAt.getTime()).toBeLessThanOrEqual(Date.now() + 5_000);
    expect(handle.signal.aborted).toBe(false);
    expect(handle.isHeld).toBe(true);
    await handle.release();
    expect(handle.isHeld).toBe(false);
    await handle.release(); // twice is harmless
  });

  it('extend() pushes the expiry out', async () => {
    locks = new LockService();
    const handle = await locks.acquire('ext', { ttl: 1_000, autoExtend: false });
    await handle.extend(60_000);
    expect(handle.expiresAt.getTime()).toBeGreaterThan(Date.now() + 50_000);
    expect((await locks.inspect('ext'))?.ttlMs).toBeGreaterThan(50_000);
    await handle.release();
  });

  it('releases at the end of an `await using` block', async () => {
    locks = new LockService();
    {
      await using handle = await locks.acquire('scoped');
      expect(handle.isHeld).toBe(true);
      expect(await locks.isLocked('scoped')).toBe(true);
    }
    expect(await locks.isLocked('scoped')).toBe(false);
  });

  it('inspect() tells the token, the remaining lease, whether this process holds it, and who holds it', async () => {
    locks = new LockService(undefined, { instance: 'web-1' });
    const other = new LockService(locks.backend);
    expect(await locks.inspect('i')).toBeUndefined();
    const handle = await locks.acquire('i', { ttl: 8_000 });
    const holder = {
      id: expect.any(String),
      ttlMs: expect.any(Number),
      fencingToken: handle.fencingToken,
      heldHere: true,
      instance: 'web-1',
    };
    expect(await locks.inspect('i')).toEqual({
      key: 'lock:i',
      ttlMs: expect.any(Number),
      fencingToken: handle.fencingToken,
      heldHere: true,
      mode: 'exclusive',
      limit: 1,
      holders: [{ ...holder, acquiredAt: expect.any(Number) }],
      waiters: [],
    });
    expect((await other.inspect('i'))?.heldHere).toBe(false);
    await handle.release();
  });

  it('wakes waiters in FIFO order, without polling', async () => {
    locks = new LockService(new MemoryLockBackend(), { pollInterval: 60_000 });
    const order: number[] = [];
    const holder = await locks.acquire('fifo');
    const waiters = Array.from({ length: 6 }, (_, i) =>
      locks.using('fifo', async () => {
        order.push(i);
        await new Promise((resolve) => setImmediate(resolve));
      }),
    );
    // Newcomers after the queue formed must not overtake it.
    await new Promise((resolve) => setImmediate(resolve));
    const late = locks.using('fifo', () => void order.push(99));
    await holder.release();
    await Promise.all([...waiters, late]);
    expect(order).toEqual([0, 1, 2, 3, 4, 5, 99]);
  });

  it('a caller that comes right after a release, before the woken waiter ran, goes behind that waiter', async () => {
    locks = new LockService(new MemoryLockBackend(), { pollInterval: 60_000 });
    const order: string[] = [];
    const holder = await locks.acquire('handover');
    const waiter = locks.using('handover', () => void order.push('waiter'));
    await new Promise((resolve) => setImmediate(resolve));
    // The in-memory backend frees the key at once: only the queue stops the newcomer taking it.
    const released = holder.release();
    const late = locks.using('handover', () => void order.push('late'));
    await Promise.all([released, waiter, late]);
    expect(order).toEqual(['waiter', 'late']);
  });

  it('stops waiting when the caller aborts, leaving nothing queued', async () => {
    locks = new LockService();
    const holder = await locks.acquire('abort');
    const controller = new AbortController();
    const waiting = locks.acquire('abort', { signal: controller.signal });
    controller.abort(new Error('client went away'));
    await expect(waiting).rejects.toThrow('client went away');
    await holder.release();
    const next = await locks.acquire('abort', { wait: 0 });
    await next.release();
  });

  it('onBusy: skip returns undefined without running; throw raises LockNotAcquiredError', async () => {
    locks = new LockService();
    const holder = await locks.acquire('busy');
    let ran = false;
    expect(await locks.using('busy', () => (ran = true), { wait: 0, onBusy: 'skip' })).toBeUndefined();
    await expect(locks.using('busy', () => (ran = true), { wait: 0 })).rejects.toBeInstanceOf(LockNotAcquiredError);
    expect(ran).toBe(false);
    await holder.release();
  });

  it('says what the caller asked when a busy lock is refused: no wait, or the wait it gave, with the time measured', async () => {
    locks = new LockService();
    const holder = await locks.acquire('asked');
    const noWait = await locks.acquire('asked', { wait: 0 }).catch((error: unknown) => error as LockNotAcquiredError);
    expect(noWait).toBeInstanceOf(LockNotAcquiredError);
    expect(noWait).toMatchObject({ waitMs: 0 });
    expect((noWait as Error).message).toMatch(
      /^Lock not acquired: lock:asked was held by another owner\. The call asked not to wait \(wait: 0\): its one attempt took \d+ ms\./,
    );
    expect((noWait as Error).message).not.toContain('whole wait');
    const waited = await locks.using('asked', () => undefined, { wait: 30 }).catch((error: unknown) => error as LockNotAcquiredError);
    expect(waited).toMatchObject({ waitMs: 30 });
    expect((waited as Error).message).toMatch(/held by another owner for the whole wait asked \(30 ms; gave up after \d+ ms\)/);
    await holder.release();
  });

  it("passes the method's own error through and releases the lock", async () => {
    locks = new LockService();
    const failure = new Error('card declined');
    await expect(locks.using('pay', () => Promise.reject(failure))).rejects.toBe(failure);
    expect(await locks.isLocked('pay')).toBe(false);
  });

  it("keeps the method's result when the release fails", async () => {
    const backend = new MemoryLockBackend();
    backend.release = async () => {
      throw new Error('connection reset');
    };
    locks = new LockService(backend);
    expect(await locks.using('r', () => 'result')).toBe('result');
  });

  it('fires the signal with reason "taken" when an extension finds another owner', async () => {
    const backend = new MemoryLockBackend();
    locks = new LockService(backend);
    const handle = await locks.acquire('stolen', { ttl: 300 });
    // Someone deletes the key behind our back (an operator, a failover without the key).
    const owner = (await backend.inspect('lock:stolen'))!.owner;
    await backend.release(['lock:stolen'], owner);
    await new Promise((resolve) => handle.signal.addEventListener('abort', resolve));
    expect(handle.signal.reason).toBeInstanceOf(LockLostError);
    expect((handle.signal.reason as LockLostError).reason).toBe('taken');
    await expect(handle.extend()).rejects.toBeInstanceOf(LockLostError);
  });

  it('fires the signal when the event loop stalls past the deadline, even though the key is still there', async () => {
    locks = new LockService();
    const handle = await locks.acquire('stall', { ttl: 200 });
    const until = performance.now() + 400;
    while (performance.now() < until) {
      // A synchronous stall: the watchdog cannot run.
    }
    // Read after the stall, the signal has already aborted: the deadline is checked on every read.
    expect(handle.signal.aborted).toBe(true);
    expect((handle.signal.reason as LockLostError).reason).toBe('expired');
  });

  it('on shutdown, fails every waiting acquisition at once and refuses new ones, leaving no timer', async () => {
    locks = new LockService();
    const held = await locks.acquire('busy', { ttl: 60_000 });
    // Counted once the holder's lease is scheduled: the process's lease scheduler then has its one
    // timer armed, which may fire meanwhile but is never added to.
    const timersBefore = activeTimers();
    // The first waiter of the process and one queued behind it, both willing to wait a minute.
    const waiting = [locks.acquire('busy', { wait: 60_000 }), locks.using('busy', () => 'ran', { wait: 60_000 })].map((p) =>
      p.catch((e: unknown) => e),
    );
    await new Promise((resolve) => setImmediate(resolve));
    const started = Date.now();
    await locks.onApplicationShutdown();
    for (const error of await Promise.all(waiting)) {
      expect(error).toBeInstanceOf(LockBackendError);
      expect((error as Error).message).toBe("Lock backend 'memory' failed: acquire of lock:busy failed: the application is shutting down.");
    }
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(held.isHeld).toBe(false);
    await expect(locks.acquire('other')).rejects.toThrow('the application is shutting down');
    // At most as many as before: the waiters' minute-long timers are gone. (Other test files of
    // this worker may still have a short timer come and go: allowed a moment to settle.)
    await eventually(() => expect(activeTimers()).toBeLessThanOrEqual(timersBefore), 2_000);
  });

  it('gives back a lock won while the application shut down, and fails that acquisition', async () => {
    let answer: (result: { acquired: true; fencingToken: number }) => void = () => undefined;
    const released: string[] = [];
    const slow: LockBackend = {
      name: 'slow',
      fencing: true,
      tryAcquire: () => new Promise((resolve) => (answer = resolve)),
      extend: async () => ({ extended: true }),
      release: async (_keys, owner) => {
        released.push(owner);
        return true;
      },
      inspect: async () => undefined,
    };
    locks = new LockService(slow);
    const acquiring = locks.acquire('late', { wait: 60_000 }).catch((e: unknown) => e);
    const shuttingDown = locks.onApplicationShutdown();
    answer({ acquired: true, fencingToken: 1 });
    const error = await acquiring;
    await shuttingDown;
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toContain('the application is shutting down');
    expect(released).toHaveLength(1);
  });

  it('never enters a section with a lock whose answer came after its lease ran out: it tries again within the wait', async () => {
    // The first answer is held back longer than the ttl (a slow network, a paused process): the
    // lease it won has run out by the time it arrives, and another may hold the key by then.
    const memory = new MemoryLockBackend();
    let calls = 0;
    const late: LockBackend = {
      name: 'late',
      fencing: true,
      tryAcquire: async (keys, owner, ttl) => {
        const result = await memory.tryAcquire(keys, owner, ttl);
        if (++calls === 1) await new Promise((resolve) => setTimeout(resolve, ttl + 50));
        return result;
      },
      extend: (keys, owner, ttl) => memory.extend(keys, owner, ttl),
      release: (keys, owner) => memory.release(keys, owner),
      inspect: (key) => memory.inspect(key),
    };
    locks = new LockService(late, { pollInterval: 20 });
    const heldAtEntry = await locks.using('slow-answer', (handle) => handle.isHeld, { ttl: 100, wait: 2_000 });
    expect(heldAtEntry).toBe(true);
    expect(calls).toBeGreaterThan(1);
    // Without a wait there is no second try: busy, not a section run without the lock.
    calls = 0;
    const error = await locks.using('slow-answer-2', () => 'entered', { ttl: 100, wait: 0 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockNotAcquiredError);
  });

  it('turns a failing backend into LockBackendError within the wait, never a hang', async () => {
    const down: LockBackend = {
      name: 'down',
      fencing: true,
      tryAcquire: async () => {
        throw new Error('ECONNREFUSED');
      },
      extend: async () => ({ extended: false }),
      release: async () => false,
      inspect: async () => undefined,
    };
    locks = new LockService(down, { pollInterval: 20 });
    const started = Date.now();
    const error = await locks.acquire('k', { wait: 200 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toContain("'down'");
    expect((error as Error).cause).toEqual(new Error('ECONNREFUSED'));
    expect(Date.now() - started).toBeLessThan(5_000);
    await expect(locks.acquire('k', { wait: 0 })).rejects.toBeInstanceOf(LockBackendError);
  });

  it('a refusal the backend marks permanent ends the wait at once, after one attempt', async () => {
    let attempts = 0;
    const refusing: LockBackend = {
      name: 'refusing',
      fencing: true,
      tryAcquire: async () => {
        attempts++;
        throw new LockBackendError('refusing', 'authentication failed: check the password', undefined, { permanent: true });
      },
      extend: async () => ({ extended: false }),
      release: async () => false,
      inspect: async () => undefined,
    };
    locks = new LockService(refusing, { pollInterval: 20 });
    const error = await locks.acquire('k', { wait: 60_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as LockBackendError).permanent).toBe(true);
    expect((error as Error).message).toContain('check the password');
    expect(attempts).toBe(1);
  });

  it('a permanent refusal of a request the store applied still frees what it won, waiting or not', async () => {
    // A store that applied the acquire, then refused for good (the reconnection's AUTH was
    // refused and the command already sent is reported failed with it).
    class AppliedThenRefused implements LockBackend {
      readonly name = 'refusing';
      readonly fencing = true;
      readonly won: string[] = [];
      readonly releases: string[] = [];
      readonly store = new MemoryLockBackend();
      async tryAcquire(keys: readonly string[], owner: string, ttlMs: number): Promise<never> {
        if ((await this.store.tryAcquire(keys, owner, ttlMs)).acquired) this.won.push(owner);
        throw new LockBackendError('refusing', 'authentication failed: check the password', undefined, { permanent: true });
      }
      extend(keys: readonly string[], owner: string, ttlMs: number) {
        return this.store.extend(keys, owner, ttlMs);
      }
      release(keys: readonly string[], owner: string): Promise<boolean> {
        this.releases.push(owner);
        return this.store.release(keys, owner);
      }
      inspect(key: string) {
        return this.store.inspect(key);
      }
    }
    const backend = new AppliedThenRefused();
    locks = new LockService(backend, { pollInterval: 20 });
    for (const [key, wait] of [
      ['waits', 60_000],
      ['does-not-wait', 0],
    ] as const) {
      const error = await locks.acquire(key, { wait }).catch((e: unknown) => e);
      expect((error as LockBackendError).permanent).toBe(true);
      const owner = backend.won.at(-1)!;
      await eventually(async () => {
        expect(backend.releases).toContain(owner);
        expect(await backend.inspect(`lock:${key}`)).toBeUndefined();
      }, 10_000);
    }
  });

  it('an acquire aborted while its attempt is in flight rejects with the reason, and frees what the attempt won', async () => {
    const memory = new MemoryLockBackend();
    let answer!: () => void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    const slow: LockBackend = {
      name: 'slow',
      fencing: true,
      tryAcquire: async (keys, owner, ttl) => {
        await answered;
        return memory.tryAcquire(keys, owner, ttl);
      },
      extend: (...args) => memory.extend(...args),
      release: (...args) => memory.release(...args),
      inspect: (key) => memory.inspect(key),
    };
    locks = new LockService(slow);
    const controller = new AbortController();
    const acquiring = locks.acquire('aborted', { signal: controller.signal });
    controller.abort(new Error('the client went away'));
    answer();
    await expect(acquiring).rejects.toThrow('the client went away');
    await eventually(async () => expect(await memory.inspect('lock:aborted')).toBeUndefined(), 2_000);
  });

  it('at shutdown, gives back what an attempt in flight won before it closes the backend', async () => {
    let answer: (result: { acquired: true; fencingToken: number }) => void = () => undefined;
    const calls: string[] = [];
    const slow: LockBackend = {
      name: 'slow',
      fencing: true,
      tryAcquire: () => new Promise((resolve) => (answer = resolve)),
      extend: async () => ({ extended: true }),
      release: async () => {
        calls.push('release');
        return true;
      },
      inspect: async () => undefined,
      close: async () => {
        calls.push('close');
      },
    };
    locks = new LockService(slow);
    const acquiring = locks.acquire('late', { wait: 60_000 }).catch((e: unknown) => e);
    const shuttingDown = locks.onApplicationShutdown();
    // Shutdown has every chance to close the backend before the answer comes.
    await new Promise((resolve) => setImmediate(resolve));
    answer({ acquired: true, fencingToken: 1 });
    await shuttingDown;
    expect(await acquiring).toBeInstanceOf(LockBackendError);
    expect(calls).toEqual(['release', 'close']);
  });
});
