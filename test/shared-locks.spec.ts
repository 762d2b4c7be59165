import { afterEach, describe, expect, it } from '@jest/globals';
import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  DistributedLockModule,
  InvalidLockOptionsError,
  Locked,
  LockNotAcquiredError,
  LockService,
  MemoryLockBackend,
  type LockBackend,
  type LockEventMap,
} from '../lib/index.js';
import { until } from './support/wait.js';

/** The in-memory backend as a store that holds exclusive locks only would present itself. */
function exclusiveOnly(): LockBackend {
  const inner = new MemoryLockBackend();
  return {
    name: 'exclusive-store',
    fencing: true,
    tryAcquire: (...args) => inner.tryAcquire(...args),
    extend: (...args) => inner.extend(...args),
    release: (...args) => inner.release(...args),
    inspect: (...args) => inner.inspect(...args),
  };
}

describe('shared locks and semaphores', () => {
  let locks: LockService;
  afterEach(async () => {
    await locks?.onApplicationShutdown();
  });

  describe('options', () => {
    it.each([
      [{ permits: 0 }, "option 'permits' must be a positive integer, got 0"],
      [{ permits: 2.5 }, "option 'permits' must be a positive integer, got 2.5"],
      [{ permits: '3' }, "option 'permits' must be a positive integer, got '3'"],
      [{ mode: 'read' }, "option 'mode' must be 'exclusive' or 'shared', got 'read'"],
      [{ mode: 'shared', permits: 3 }, "options 'permits' (3) and 'mode' ('shared') ask for two kinds of lock"],
      [{ mode: 'exclusive', permits: 3 }, "options 'permits' (3) and 'mode' ('exclusive') ask for two kinds of lock"],
    ])('refuses %j on every entry point with a typed error', async (options, message) => {
      locks = new LockService();
      for (const call of [
        () => locks.acquire('k', options as never),
        () => locks.tryAcquire('k', options as never),
        () => locks.using('k', () => undefined, options as never),
      ]) {
        const error = await call().catch((e: unknown) => e);
        expect(error).toBeInstanceOf(InvalidLockOptionsError);
        expect((error as Error).message).toContain(message);
      }
    });

    it('refuses them on a backend without shared holders, naming it, before asking it anything', async () => {
      locks = new LockService(exclusiveOnly());
      for (const options of [{ mode: 'shared' as const }, { permits: 2 }]) {
        const error = await locks.acquire('k', options).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(InvalidLockOptionsError);
        expect((error as Error).message).toContain('the exclusive-store backend holds exclusive locks only');
      }
      await (await locks.acquire('k')).release();
    });

    it('refuses a caller whose permits differ from the holders of the key, saying both and the key', async () => {
      locks = new LockService();
      const held = await locks.acquire('export', { permits: 3 });
      const error = await locks.acquire('export', { permits: 5 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe('permits');
      expect((error as Error).message).toMatch(/lock:export is held as 3 permits .* this call asked for 5 permits/);
      await held.release();
    });
  });

  describe('holding', () => {
    it('lets readers hold together, tells the kind on handles, inspect() and events', async () => {
      locks = new LockService();
      const other = new LockService(locks.backend);
      const seen: Partial<LockEventMap['acquired']>[] = [];
      locks.events.on('acquired', (event) => seen.push(event));
      const r1 = await locks.acquire('catalog', { mode: 'shared' });
      const r2 = await other.acquire('catalog', { mode: 'shared', wait: 0 });
      expect([r1.mode, r1.permits, r1.toJSON().mode]).toEqual(['shared', undefined, 'shared']);
      expect(r2.fencingToken).toBeGreaterThan(r1.fencingToken!);
      const info = await locks.inspect('catalog');
      expect(info).toMatchObject({ key: 'lock:catalog', mode: 'shared', limit: Infinity, heldHere: true, fencingToken: r2.fencingToken });
      expect(info?.holders?.map((h) => h.heldHere)).toEqual([true, false]);
      expect(seen).toEqual([expect.objectContaining({ keys: ['lock:catalog'], mode: 'shared', reentrant: false })]);
      expect(await locks.tryAcquire('catalog')).toBeUndefined();
      await r1.release();
      await r2.release();
      await other.onApplicationShutdown();
    });

    it('admits as many holders as permits, and says so when the key is full', async () => {
      locks = new LockService();
      const held = [await locks.acquire('supplier', { permits: 2 }), await locks.acquire('supplier', { permits: 2 })];
      expect(held.map((h) => [h.mode, h.permits])).toEqual([
        ['permits', 2],
        ['permits', 2],
      ]);
      expect((await locks.inspect('supplier'))?.holders).toHaveLength(2);
      const error = await locks.acquire('supplier', { permits: 2, wait: 0 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LockNotAcquiredError);
      expect(error).toMatchObject({ mode: 'permits', permits: 2 });
      expect((error as Error).message).toContain('had all 2 permits taken');
      await held[0].release();
      await (await locks.acquire('supplier', { permits: 2, wait: 0 })).release();
      await held[1].release();
    });

    it('in one process: readers queued together enter together, and a queued writer blocks later readers', async () => {
      locks = new LockService(new MemoryLockBackend(), { pollInterval: 60_000 });
      const writer = await locks.acquire('doc');
      const order: string[] = [];
      const enter = (name: string, options: { mode?: 'shared' }) =>
        locks.acquire('doc', { ...options, wait: 20_000 }).then((handle) => (order.push(name), handle));
      const r1 = enter('r1', { mode: 'shared' });
      // Waiting, its first attempt answered: those after it queue behind it without asking the store.
      await until(() => !locks.queue.allTrying('lock:doc'), 5_000, 'the first reader to wait');
      const r2 = enter('r2', { mode: 'shared' });
      const w2 = enter('w2', {});
      const r3 = enter('r3', { mode: 'shared' });
      // A failed expectation leaves some waiting: shutdown then ends their waits, which is no error of its own.
      for (const waiting of [r1, r2, w2, r3]) waiting.catch(() => undefined);
      await until(() => locks.queue.waiting === 4, 5_000, 'four waiters');
      await writer.release();
      const readers = [await r1, await r2];
      // Readers that fit together enter in either order; the writer queued after them, and the reader after it, wait.
      expect([...order].sort()).toEqual(['r1', 'r2']);
      for (const reader of readers) await reader.release();
      const w = await w2;
      expect(order.slice(2)).toEqual(['w2']);
      await w.release();
      await (await r3).release();
      expect(order.slice(2)).toEqual(['w2', 'r3']);
    });
  });

  describe('re-entering', () => {
    it('nests the same kind, lets an exclusive holder enter as shared, and refuses an upgrade at once', async () => {
      locks = new LockService();
      await locks.using('k', async () => {
        const inner = await locks.using('k', (handle) => [handle.reentrant, handle.mode], { mode: 'shared' });
        expect(inner).toEqual([true, 'shared']);
      });
      await locks.using(
        'k',
        async () => {
          expect(await locks.using('k', (handle) => handle.reentrant, { mode: 'shared' })).toBe(true);
          const upgrade = await locks.using('k', () => 'ran').catch((e: unknown) => e);
          expect(upgrade).toBeInstanceOf(InvalidLockOptionsError);
          expect((upgrade as Error).message).toContain('Upgrading a shared lock to an exclusive one deadlocks');
          const other = await locks.using('k', () => 'ran', { permits: 2 }).catch((e: unknown) => e);
          expect(other).toBeInstanceOf(InvalidLockOptionsError);
        },
        { mode: 'shared' },
      );
      await locks.using(
        'sem',
        async () => {
          expect(await locks.using('sem', (handle) => handle.reentrant, { permits: 2 })).toBe(true);
        },
        { permits: 2 },
      );
    });
  });

  it('@Locked takes the kind from its options', async () => {
    @Injectable()
    class Catalog {
      constructor(readonly locks: LockService) {}
      @Locked('catalog', { mode: 'shared' })
      async read(): Promise<string | undefined> {
        return this.locks.current('catalog')?.mode;
      }
      @Locked('export:<tenant>', { permits: 3 })
      async export(tenant: string): Promise<number | undefined> {
        return this.locks.current(`export:${tenant}`)?.permits;
      }
    }
    const moduleRef = await Test.createTestingModule({ imports: [DistributedLockModule.forRoot()], providers: [Catalog] }).compile();
    await moduleRef.init();
    locks = moduleRef.get(LockService);
    const catalog = moduleRef.get(Catalog);
    const writer = await locks.acquire('catalog');
    const reading = catalog.read();
    await writer.release();
    expect(await reading).toBe('shared');
    expect(await Promise.all([catalog.export('t1'), catalog.export('t1')])).toEqual([3, 3]);
    await moduleRef.close();
  });
});
