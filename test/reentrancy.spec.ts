import 'reflect-metadata';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { Injectable, Module } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { performance } from 'node:perf_hooks';
import {
  DistributedLockModule,
  InvalidLockKeyError,
  LockLostError,
  LockNotAcquiredError,
  LockService,
  Locked,
  MemoryLockBackend,
} from '../lib/index.js';
import type { AcquireResult, ImmediateLockSteps, LockBackend } from '../lib/backends/lock-backend.interface.js';
import { until } from './support/wait.js';

interface Attempt {
  keys: string[];
  acquired: boolean;
  /** 'at once': the in-memory backend's answer without a promise (LockBackend.immediate), as production takes it. */
  path: 'at once' | 'promise';
}

/**
 * The in-memory backend with a record of every acquisition asked of it. A wrapper, not a spy: a
 * replaced tryAcquire switches off the answers without a promise (`immediate`), and with them
 * the path every first attempt takes in production. This one offers them as the backend does.
 */
class RecordingBackend implements LockBackend {
  readonly name = 'memory';
  readonly fencing = true;
  readonly attempts: Attempt[] = [];

  constructor(readonly inner = new MemoryLockBackend()) {}

  get immediate(): ImmediateLockSteps | undefined {
    const steps = this.inner.immediate;
    return (
      steps && {
        tryAcquire: (keys, owner, ttlMs, now) => this.record(keys, steps.tryAcquire(keys, owner, ttlMs, now), 'at once'),
        release: (keys, owner) => steps.release(keys, owner),
      }
    );
  }

  async tryAcquire(keys: readonly string[], owner: string, ttlMs: number): Promise<AcquireResult> {
    return this.record(keys, await this.inner.tryAcquire(keys, owner, ttlMs), 'promise');
  }

  extend(...args: Parameters<LockBackend['extend']>) {
    return this.inner.extend(...args);
  }

  release(...args: Parameters<LockBackend['release']>) {
    return this.inner.release(...args);
  }

  inspect(...args: Parameters<LockBackend['inspect']>) {
    return this.inner.inspect(...args);
  }

  watch(keys: readonly string[], onRelease: () => void) {
    return this.inner.watch(keys, onRelease);
  }

  close() {
    return this.inner.close();
  }

  private record(keys: readonly string[], result: AcquireResult, path: Attempt['path']): AcquireResult {
    this.attempts.push({ keys: [...keys], acquired: result.acquired, path });
    return result;
  }
}

const backend = new RecordingBackend();

@Injectable()
class Orders {
  constructor(readonly locks: LockService) {}

  @Locked('order:<id>')
  async pay(id: number) {
    const token = this.locks.current()?.fencingToken;
    return { token, charged: await this.charge(id) };
  }

  @Locked('order:<id>')
  async charge(id: number) {
    return this.locks.current()!;
  }
}

@Module({ imports: [DistributedLockModule.forRoot({ backend })], providers: [Orders] })
class AppModule {}

function deferred() {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

describe('reentrancy', () => {
  let moduleRef: TestingModule;
  let orders: Orders;
  let locks: LockService;

  beforeEach(async () => {
    moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await moduleRef.init();
    orders = moduleRef.get(Orders);
    locks = moduleRef.get(LockService);
    backend.attempts.length = 0;
  });
  afterEach(async () => {
    await moduleRef.close();
  });

  it('enters a lock its caller holds without a second acquisition', async () => {
    const { token, charged } = await orders.pay(1);
    // One acquisition, answered without a promise: the path production takes on this backend.
    expect(backend.attempts).toEqual([{ keys: ['lock:order:1'], acquired: true, path: 'at once' }]);
    expect(charged.reentrant).toBe(true);
    expect(charged.fencingToken).toBe(token);
  });

  it('releases when the outermost holder exits, not when an inner one does', async () => {
    await locks.using('order:2', async () => {
      await locks.using('order:2', async (inner) => expect(inner.reentrant).toBe(true));
      expect(await locks.isLocked('order:2')).toBe(true);
    });
    expect(await locks.isLocked('order:2')).toBe(false);
  });

  it('lets Promise.all children of a holder in at once, together, and keeps others out until all are done', async () => {
    const gate = deferred();
    let inside = 0;
    let most = 0;
    let outsiderRanWhileChildren = false;
    const outsider = deferred();
    const holder = locks.using('order:3', async (outer) => {
      await Promise.all(
        [1, 2, 3].map(() =>
          locks.using('order:3', async (child) => {
            expect(child.fencingToken).toBe(outer.fencingToken);
            most = Math.max(most, ++inside);
            await gate.promise;
            inside--;
          }),
        ),
      );
    });
    // A caller outside the holder's async context: it must wait for the children too.
    const outside = (async () => {
      outsider.open();
      await locks.using('order:3', async () => {
        outsiderRanWhileChildren = inside > 0;
      });
    })();
    await outsider.promise;
    await new Promise((resolve) => setImmediate(resolve));
    expect(most).toBe(3);
    gate.open();
    await Promise.all([holder, outside]);
    expect(outsiderRanWhileChildren).toBe(false);
    expect(backend.attempts.length).toBeGreaterThanOrEqual(2);
  });

  it('keeps the lock for a child still inside when its holder exits, and gives it up when the child exits', async () => {
    const gate = deferred();
    const entered = deferred();
    let child!: Promise<void>;
    await locks.using('order:4', async () => {
      child = locks.using('order:4', async () => {
        entered.open();
        await gate.promise;
      });
      await entered.promise;
    });
    expect(await locks.isLocked('order:4')).toBe(true);
    gate.open();
    await child;
    expect(await locks.isLocked('order:4')).toBe(false);
  });

  it('never re-enters a released lock: a task that outlives its holder acquires anew', async () => {
    const gate = deferred();
    let late!: Promise<{ reentrant: boolean; token?: number }>;
    let outerToken: number | undefined;
    await locks.using('order:5', async (outer) => {
      outerToken = outer.fencingToken;
      late = (async () => {
        await gate.promise;
        return locks.using('order:5', async (h) => ({ reentrant: h.reentrant, token: h.fencingToken }));
      })();
    });
    gate.open();
    const result = await late;
    expect(result.reentrant).toBe(false);
    expect(result.token).toBeGreaterThan(outerToken!);
  });

  it('never re-enters a lost lock', async () => {
    await locks.using(
      'order:6',
      async (outer) => {
        await new Promise((resolve) => outer.signal.addEventListener('abort', resolve));
        expect(outer.signal.reason).toBeInstanceOf(LockLostError);
        const inner = await locks.using('order:6', async (h) => ({ reentrant: h.reentrant, token: h.fencingToken }));
        expect(inner.reentrant).toBe(false);
        expect(inner.token).toBeGreaterThan(outer.fencingToken!);
      },
      { ttl: 150, autoExtend: false },
    );
  });

  it('acquires only the keys it lacks when a nested scope asks for more', async () => {
    await locks.using('a', async (outer) => {
      await locks.using(['a', 'b'], async (both) => {
        expect(both.reentrant).toBe(true);
        expect(both.fencingTokenFor('lock:a')).toBe(outer.fencingToken);
        expect(both.fencingTokenFor('lock:b')).toBeGreaterThan(outer.fencingToken!);
        expect(await locks.isLocked('b')).toBe(true);
      });
      expect(await locks.isLocked('b')).toBe(false);
      expect(await locks.isLocked('a')).toBe(true);
    });
  });

  it("sees no holder outside a scope, and the scope's handle inside it", async () => {
    expect(locks.current()).toBeUndefined();
    await locks.using('order:7', async (handle) => {
      expect(locks.current('order:7')).toBe(handle);
      expect(locks.current('order:8')).toBeUndefined();
    });
    expect(locks.current('order:7')).toBeUndefined();
  });

  it('re-enters only through the service that holds the lock: another backend acquires for itself', async () => {
    // Two services of one process on different backends (say in-memory and Redis), and a second
    // instance on the second backend: holding a key in the first says nothing about the second.
    const shared = new MemoryLockBackend();
    const other = new LockService(shared);
    const otherInstance = new LockService(shared);
    // The second instance asks from outside the holders' async context, as another process would.
    const inside = deferred();
    const probed = inside.promise.then(() => otherInstance.tryAcquire('order:9'));
    try {
      await locks.using('order:9', async () => {
        await other.using('order:9', async (handle) => {
          expect(handle.reentrant).toBe(false);
          inside.open();
          expect(await probed).toBeUndefined();
        });
      });
    } finally {
      await other.onApplicationShutdown();
      await otherInstance.onApplicationShutdown();
    }
  });

  it('refuses to add a key that sorts before one it holds, naming the keys, and takes nothing', async () => {
    await locks.using('b', async () => {
      const adding = locks.using(['a', 'b'], async () => 'ran');
      await expect(adding).rejects.toThrow(InvalidLockKeyError);
      await expect(adding).rejects.toThrow(/lock:a.*lock:b/);
      expect(await locks.isLocked('a')).toBe(false);
      // Keys that sort after the held ones keep the global order: allowed.
      await expect(locks.using(['b', 'c'], async () => 'ran')).resolves.toBe('ran');
    });
  });

  it('acquires everything anew when the outer holder released while a nested call waited for more', async () => {
    const busy = await locks.acquire('y');
    let nested!: Promise<{ reentrant: boolean; held: boolean }>;
    const asked = deferred();
    await locks.using('x', async () => {
      nested = locks.using(['x', 'y'], async (h) => ({ reentrant: h.reentrant, held: await locks.isLocked('x') }), { wait: 5_000 });
      // Asked, and waiting for 'y' (the outer one is its only holder until it has both).
      await new Promise((resolve) => setImmediate(resolve));
      asked.open();
    });
    await asked.promise;
    expect(await locks.isLocked('x')).toBe(false);
    await busy.release();
    await expect(nested).resolves.toEqual({ reentrant: false, held: true });
  });

  it('keeps the whole wait asked when outer holders let go twice while a nested call waited', async () => {
    // Every outer lease that ends while the nested call waits sends it round again with what is
    // left of its wait. That is counted from its start each time, or a third round gets less.
    const asked = 600;
    // Attempts that found a key busy, by the keys they asked for.
    const refused = (keys: string) => backend.attempts.some((a) => !a.acquired && a.keys.join() === keys);
    const busyC = await locks.acquire('c');
    let nested!: Promise<unknown>;
    let started = 0;
    const busyB = await locks.using('a', async () => {
      await locks.using('b', async () => {
        started = performance.now();
        nested = locks.using(['a', 'b', 'c'], async () => 'ran', { wait: asked });
        await until(() => refused('lock:c'), 2_000, 'the first round to wait for c');
      });
      // 'b' was let go: another holder takes it before the nested call asks for it again.
      const b = await locks.acquire('b');
      // The first round has waited a while when 'c' comes free.
      await new Promise((resolve) => setTimeout(resolve, 200));
      await busyC.release();
      await until(() => refused('lock:b,lock:c'), 2_000, 'the second round to wait for b');
      return b;
    });
    // 'a' was let go too: taken by another holder (outside the scope, so not a re-entry) before the
    // second round ends. The third round asks for everything and waits on 'a' until its time is up.
    const busyA = await locks.acquire('a');
    await busyB.release();
    await expect(nested).rejects.toThrow(LockNotAcquiredError);
    const waited = performance.now() - started;
    expect(refused('lock:a,lock:b,lock:c')).toBe(true);
    expect(waited).toBeGreaterThanOrEqual(asked - 20);
    await busyA.release();
  });
});
