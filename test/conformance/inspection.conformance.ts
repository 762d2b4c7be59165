import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import type { LockHandle } from '../../lib/lock.handle.js';
import { releaseHolders } from '../../lib/forced-release.js';
import { LockService } from '../../lib/lock.service.js';
import { eventually, until } from '../support/wait.js';
import type { ConformanceTarget } from './lock-backend.conformance.js';

/**
 * inspect() and list(): who holds and waits, as another process sees it, and paging through held
 * keys (docs/inspection.md). Called by describeBackendConformance, so each backend's spec runs it;
 * identity tests run where the backend stores it (`storesIdentity`), listing where it lists.
 */
export function describeInspectionConformance(name: string, target: ConformanceTarget): void {
  describe(`${name} backend conformance: inspect and list`, () => {
    const services: LockService[] = [];
    const handles: LockHandle[] = [];
    let run = 0;
    let probe: LockBackend;

    beforeEach(async () => {
      run++;
      probe = await target.connect();
    });

    afterEach(async () => {
      await Promise.allSettled(handles.splice(0).map((handle) => handle.release()));
      await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
      if (probe !== (await target.connect())) await probe.close?.();
      await target.reset?.();
    });

    /** A LockService over a new client, as a process named `instance` would build it. */
    async function newService(instance: string): Promise<LockService> {
      const service = new LockService(await target.connect(), { keyPrefix: `insp${run}:`, instance, wait: 30_000 });
      services.push(service);
      return service;
    }

    it('tells, to another process, who holds a key and who waits, in line order', async () => {
      if (!probe.storesIdentity) return;
      const [a, b, c, observer] = [await newService('a-1'), await newService('b-1'), await newService('c-1'), await newService('obs')];
      const before = Date.now();
      const held = await a.acquire('who', { site: 'Reports.nightly', ttl: 60_000 });
      handles.push(held);
      const after = Date.now();

      const seen = (await observer.inspect('who'))!;
      expect(seen.heldHere).toBe(false);
      expect(seen.holders).toHaveLength(1);
      const [holder] = seen.holders;
      expect(holder).toMatchObject({ instance: 'a-1', site: 'Reports.nightly', heldHere: false });
      if (probe.fencing) expect(holder.fencingToken).toBe(held.fencingToken);
      // The store's clock on this machine: within a second of ours.
      expect(holder.acquiredAt).toBeGreaterThanOrEqual(before - 1_000);
      expect(holder.acquiredAt).toBeLessThanOrEqual(after + 1_000);
      expect((await a.inspect('who'))!.holders[0].heldHere).toBe(true);

      // Two waiters of two processes, b first: the line shows them in that order.
      const bWaits = b.acquire('who', { site: 'Billing.charge' });
      // Seen by the test below; a failed assertion must not leave it unhandled.
      bWaits.catch(() => undefined);
      await eventually(async () => expect((await observer.inspect('who'))!.waiters?.map((w) => w.instance)).toEqual(['b-1']), 10_000);
      const cWaits = c.acquire('who', { site: 'Billing.refund' });
      cWaits.catch(() => undefined);
      await eventually(
        async () => expect((await observer.inspect('who'))!.waiters?.map((w) => w.instance)).toEqual(['b-1', 'c-1']),
        10_000,
      );
      const line = (await observer.inspect('who'))!.waiters!;
      expect(line.map((w) => w.site)).toEqual(['Billing.charge', 'Billing.refund']);
      expect(line.every((w) => w.mode === 'exclusive')).toBe(true);
      expect(line[0].waitingSince).toBeLessThanOrEqual(line[1].waitingSince!);
      expect(line[0].waitingSince).toBeGreaterThanOrEqual(before - 1_000);

      // Released: b holds, c waits.
      await held.release();
      const bHolds = await bWaits;
      handles.push(bHolds);
      await eventually(async () => {
        const state = (await observer.inspect('who'))!;
        expect(state.holders.map((h) => [h.instance, h.site])).toEqual([['b-1', 'Billing.charge']]);
        expect(state.waiters?.map((w) => w.instance)).toEqual(['c-1']);
      }, 10_000);
      await bHolds.release();
      handles.push(await cWaits);
    }, 60_000);

    it('tells every holder of a shared key with its identity, and waiters of every kind in line order', async () => {
      if (!probe.storesIdentity || !probe.sharedHolders) return;
      const [a, b, c, d, observer] = await Promise.all(['a-1', 'b-1', 'c-1', 'd-1', 'obs'].map((name) => newService(name)));
      const readers = [await a.acquire('read', { mode: 'shared', site: 'Catalog.read' }), await b.acquire('read', { mode: 'shared' })];
      handles.push(...readers);
      // A writer waits behind the readers, and a reader behind the writer (it does not pass it).
      const writer = c.acquire('read', { site: 'Catalog.rebuild' });
      writer.catch(() => undefined);
      await eventually(async () => expect((await observer.inspect('read'))!.waiters).toHaveLength(1), 10_000);
      const reader = d.acquire('read', { mode: 'shared', site: 'Catalog.read' });
      reader.catch(() => undefined);
      await eventually(async () => expect((await observer.inspect('read'))!.waiters).toHaveLength(2), 10_000);

      const seen = (await observer.inspect('read'))!;
      expect(seen.mode).toBe('shared');
      const who = seen.holders.map((h) => [h.instance, h.site]).sort();
      expect(who).toEqual([
        ['a-1', 'Catalog.read'],
        ['b-1', undefined],
      ]);
      expect(seen.holders.every((h) => typeof h.acquiredAt === 'number')).toBe(true);
      expect(seen.waiters!.map((w) => [w.instance, w.site, w.mode])).toEqual([
        ['c-1', 'Catalog.rebuild', 'exclusive'],
        ['d-1', 'Catalog.read', 'shared'],
      ]);
      expect(seen.waiters!.every((w) => typeof w.waitingSince === 'number')).toBe(true);

      // The readers leave: the writer holds, the reader still waits.
      await Promise.all(readers.map((handle) => handle.release()));
      const writing = await writer;
      handles.push(writing);
      await eventually(async () => {
        const state = (await observer.inspect('read'))!;
        expect(state.holders.map((h) => [h.instance, h.site])).toEqual([['c-1', 'Catalog.rebuild']]);
        expect(state.waiters!.map((w) => [w.instance, w.mode])).toEqual([['d-1', 'shared']]);
      }, 10_000);
      await writing.release();
      handles.push(await reader);
    }, 30_000);

    it('a forced release from another process frees the key there and then, and the holder loses it at its next extension', async () => {
      const [holder, operator, next] = [await newService('a-1'), await newService('ops'), await newService('c-1')];
      const held = await holder.acquire('forced', { site: 'Reports.nightly', ttl: 60_000 });
      handles.push(held);
      const id = (await operator.inspect('forced'))!.holders[0].id;
      const released = await releaseHolders(operator, 'forced', { holder: id });
      expect(released).toEqual([expect.objectContaining(probe.storesIdentity ? { instance: 'a-1', site: 'Reports.nightly' } : {})]);
      // Free for the next caller, long before the holder's 60 s lease would have run out.
      const after = await next.tryAcquire('forced', { ttl: 60_000 });
      expect(after).toBeDefined();
      handles.push(after!);
      if (probe.fencing && held.fencingToken !== undefined) expect(after!.fencingToken).toBeGreaterThan(held.fencingToken);
      await expect(held.extend()).rejects.toMatchObject({ name: 'LockLostError', reason: 'taken' });
      expect(after!.isHeld).toBe(true);
      // A second forced release naming the same holder finds nothing: the newcomer keeps the key.
      expect(await releaseHolders(operator, 'forced', { holder: id })).toEqual([]);
      expect((await operator.inspect('forced'))!.holders.map((h) => h.instance)).toEqual(probe.storesIdentity ? ['c-1'] : [undefined]);
    }, 30_000);

    it('lists, page by page under churn, every key held throughout exactly once', async () => {
      if (!probe.list) return;
      const [holder, churner, observer] = [await newService('a-1'), await newService('b-1'), await newService('obs')];
      const other = new LockService(await target.connect(), { keyPrefix: `other${run}:` });
      services.push(other);
      const steady = Array.from({ length: 60 }, (_, i) => `list:${String(i).padStart(3, '0')}:held`);
      for (const key of steady) handles.push(await holder.acquire(key, { ttl: 60_000 }));
      handles.push(await holder.acquire('elsewhere:1', { ttl: 60_000 }));
      handles.push(await other.acquire('list:999', { ttl: 60_000 }));

      // Keys taken and freed all along, sorting among the steady ones.
      let churning = true;
      const churn = (async () => {
        for (let i = 0; churning; i++) {
          const handle = await churner.tryAcquire(`list:${String(i % 61).padStart(3, '0')}:churn`, { ttl: 60_000 });
          await handle?.release();
        }
      })();
      const listed: string[] = [];
      let cursor: string | undefined;
      let pages = 0;
      do {
        const page = await observer.list({ prefix: 'list:', limit: 7, cursor });
        expect(page.keys.length).toBeLessThanOrEqual(7);
        listed.push(...page.keys);
        cursor = page.cursor;
        pages++;
      } while (cursor !== undefined && pages < 1_000);
      churning = false;
      await churn;

      const held = listed.filter((key) => key.endsWith(':held'));
      expect(held.sort()).toEqual(steady);
      expect(new Set(listed).size).toBe(listed.length);
      expect(listed.every((key) => key.startsWith('list:'))).toBe(true);
      expect(pages).toBeGreaterThanOrEqual(9);
    }, 60_000);

    it('lists nothing under a free prefix, and a released key no more', async () => {
      if (!probe.list) return;
      const service = await newService('a-1');
      expect(await service.list({ prefix: 'none:' })).toEqual({ keys: [] });
      const handle = await service.acquire('gone:1');
      expect((await service.list({ prefix: 'gone:' })).keys).toEqual(['gone:1']);
      await handle.release();
      await until(async () => (await service.list({ prefix: 'gone:' })).keys.length === 0, 10_000, 'the key to leave the listing');
    });

    it('takes the prefix literally: wildcards of LIKE, glob and the escapes are plain characters', async () => {
      if (!probe.list) return;
      const service = await newService('a-1');
      const literal = 'w%_*?[|\\';
      for (const key of [`${literal}1`, 'wXY*?[|\\2', 'w%_x', 'w%', 'w|']) handles.push(await service.acquire(key));
      expect((await service.list({ prefix: literal })).keys).toEqual([`${literal}1`]);
      expect((await service.list({ prefix: 'w%' })).keys.sort()).toEqual([`${literal}1`, 'w%', 'w%_x'].sort());
    });
  });
}
