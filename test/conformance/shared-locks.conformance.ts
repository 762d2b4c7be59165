import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { SHARED, type LockBackend, type TryAcquireOptions } from '../../lib/backends/lock-backend.interface.js';
import { InvalidLockOptionsError } from '../../lib/lock.errors.js';
import type { LockHandle } from '../../lib/lock.handle.js';
import { LockService } from '../../lib/lock.service.js';
import { until } from '../support/wait.js';
import type { ConformanceTarget } from './lock-backend.conformance.js';

/** One attempt as a recording client saw it: when it was sent and answered, in one sequence for all clients. */
interface Attempt {
  owner: string;
  limit: number;
  sentAt: number;
  answeredAt?: number;
  acquired?: boolean;
}

/**
 * A new client that records every attempt, with the capabilities of the one it wraps (so the
 * service takes the path it takes on the real client; only `immediate` is left out, which shared
 * locks never take). `hideShared` leaves out `sharedHolders` as a backend without it would.
 */
async function recordingBackend(
  connect: () => Promise<LockBackend>,
  log: { seq: number; attempts: Attempt[] },
  hideShared = false,
): Promise<LockBackend> {
  const inner = await connect();
  return {
    name: inner.name,
    fencing: inner.fencing,
    sharedHolders: hideShared ? undefined : inner.sharedHolders,
    waiterTimeout: inner.waiterTimeout,
    tryAcquire: async (keys: readonly string[], owner: string, ttlMs: number, options?: TryAcquireOptions) => {
      const attempt: Attempt = { owner, limit: options?.limits?.[0] ?? 1, sentAt: log.seq++ };
      log.attempts.push(attempt);
      const result = await inner.tryAcquire(keys, owner, ttlMs, options);
      Object.assign(attempt, { answeredAt: log.seq++, acquired: result.acquired });
      return result;
    },
    extend: (...args) => inner.extend(...args),
    release: (...args) => inner.release(...args),
    inspect: (...args) => inner.inspect(...args),
    watch: inner.watch && ((...args) => inner.watch!(...args)),
    watching: inner.watching && ((...args) => inner.watching!(...args)),
    close: inner.close && (() => inner.close!()),
  };
}

/**
 * Shared (read) locks and semaphores: what every backend whose `sharedHolders` is true keeps
 * (docs/shared-locks.md), and the refusal every other one gets through the service. Called by
 * describeBackendConformance, so each backend's spec runs it.
 */
export function describeSharedConformance(name: string, target: ConformanceTarget): void {
  describe(`${name} backend conformance: shared locks and semaphores`, () => {
    const services: LockService[] = [];
    /** Clients a test made itself, closed after its services. */
    const clients: LockBackend[] = [];
    const log = { seq: 0, attempts: [] as Attempt[] };
    let run = 0;
    let shared = false;

    beforeEach(async () => {
      run++;
      log.attempts = [];
      const probe = await target.connect();
      shared = probe.sharedHolders === true;
      await probe.close?.();
    });

    async function client(): Promise<LockBackend> {
      const backend = await target.connect();
      clients.push(backend);
      return backend;
    }

    async function newService(options: ConstructorParameters<typeof LockService>[1] = {}, hideShared = false): Promise<LockService> {
      const backend = await recordingBackend(target.connect, log, hideShared);
      const service = new LockService(backend, { keyPrefix: `shared${run}:`, ...options });
      services.push(service);
      return service;
    }

    afterEach(async () => {
      await Promise.all(services.splice(0).map((s) => s.onApplicationShutdown()));
      await Promise.all(clients.splice(0).map((c) => c.close?.()));
      await target.reset?.();
    });

    /** Whether a caller's attempt of `limit` failed and it waits: its first failure was answered. */
    const queued =
      (limit: number, after = -1) =>
      () =>
        log.attempts.some((a) => a.limit === limit && a.acquired === false && a.sentAt > after);

    it('refuses shared locks and semaphores through the service when the backend has no sharedHolders', async () => {
      const locks = await newService({}, true);
      for (const options of [{ mode: 'shared' as const }, { permits: 3 }]) {
        const error = await locks.using('refused', () => 'ran', options).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(InvalidLockOptionsError);
        expect((error as Error).message).toContain(`the ${locks.backend.name} backend holds exclusive locks only`);
      }
      expect(log.attempts).toEqual([]);
      // An exclusive lock is what it always was.
      expect(await locks.using('refused', () => 'ran')).toBe('ran');
    });

    it('lets readers hold together, never a writer beside anyone, and never more holders than permits', async () => {
      if (!shared) return;
      const [a, b] = [await newService(), await newService()];
      let readers = 0;
      let writers = 0;
      let permits = 0;
      let maxReaders = 0;
      let maxPermits = 0;
      const broken: string[] = [];
      // Long enough for a reader to come in beside another where readers let in together take the
      // key one after another (etcd: a watch event and a transaction each).
      const pause = () => new Promise((resolve) => setTimeout(resolve, 10));
      await Promise.all(
        Array.from({ length: 24 }, (_, i) =>
          (async () => {
            const service = i % 2 ? a : b;
            for (let round = 0; round < 4; round++) {
              if (i % 3 === 2) {
                await service.using(
                  'sem',
                  async () => {
                    maxPermits = Math.max(maxPermits, ++permits);
                    if (permits > 3) broken.push(`${permits} permit holders of 3`);
                    await pause();
                    permits--;
                  },
                  { permits: 3, wait: 60_000, ttl: 120_000 },
                );
                continue;
              }
              const writer = i % 6 === 0;
              await service.using(
                'rw',
                async () => {
                  if (writer) writers++;
                  else maxReaders = Math.max(maxReaders, ++readers);
                  if (writers > 1 || (writers === 1 && readers > 0)) broken.push(`${writers} writer(s) with ${readers} reader(s)`);
                  await pause();
                  if (writer) writers--;
                  else readers--;
                },
                { mode: writer ? 'exclusive' : 'shared', wait: 60_000, ttl: 120_000 },
              );
            }
          })(),
        ),
      );
      expect(broken).toEqual([]);
      expect(maxPermits).toBeLessThanOrEqual(3);
      // Not a lock that only ever lets one in: readers did overlap.
      expect(maxReaders).toBeGreaterThan(1);
    }, 90_000);

    it('makes a queued writer wait for the readers ahead of it, and later readers wait for the writer', async () => {
      if (!shared) return;
      const [a, b] = [await newService({ pollInterval: 100 }), await newService({ pollInterval: 100 })];
      const r1 = await a.acquire('line', { mode: 'shared' });
      const r2 = await b.tryAcquire('line', { mode: 'shared' });
      expect(r2).toBeDefined();
      const order: string[] = [];
      const writer = b.acquire('line', { wait: 20_000 }).then((h) => (order.push('writer'), h));
      await until(queued(1), 10_000, 'the writer to wait');
      // Readers after a queued writer do not pass it, from either process.
      expect(await a.tryAcquire('line', { mode: 'shared' })).toBeUndefined();
      const mark = log.seq;
      const laterReader = a.acquire('line', { mode: 'shared', wait: 20_000 }).then((h) => (order.push('reader'), h));
      await until(queued(SHARED, mark), 10_000, 'the later reader to wait');
      // A failed expectation leaves them waiting: shutdown then ends their waits, which is no error of its own.
      for (const waiting of [writer, laterReader]) waiting.catch(() => undefined);
      await r1.release();
      expect(order).toEqual([]);
      await r2!.release();
      const w = await writer;
      expect(order).toEqual(['writer']);
      await w.release();
      const reader = await laterReader;
      expect(order).toEqual(['writer', 'reader']);
      await reader.release();
    });

    it('never lets a stream of readers keep a queued writer waiting longer than the holders ahead of it', async () => {
      if (!shared) return;
      const [a, b] = [await newService(), await newService()];
      let stop = false;
      const readers = Array.from({ length: 6 }, (_, i) =>
        (async () => {
          while (!stop) {
            await (i % 2 ? a : b).using('stream', () => new Promise((resolve) => setTimeout(resolve, 5 + (i % 3) * 5)), {
              mode: 'shared',
              wait: 60_000,
            });
          }
        })(),
      );
      // Readers overlap all the time now: without a line, a writer would never find the key free.
      await until(() => log.attempts.filter((x) => x.acquired).length > 20, 10_000, 'the readers to run');
      let handle: LockHandle;
      try {
        // A writer the readers starve times out here, and fails the test with LockNotAcquiredError.
        handle = await a.acquire('stream', { wait: 10_000 });
      } catch (error) {
        stop = true;
        await Promise.allSettled(readers);
        throw error;
      }
      stop = true;
      const failed = log.attempts.find((x) => x.limit === 1 && x.acquired === false);
      const won = log.attempts.find((x) => x.limit === 1 && x.acquired)!;
      // Released before the readers end: those queued behind the writer wait for it.
      await handle.release();
      await Promise.all(readers);
      if (failed) {
        // Every reader that entered while the writer waited had first asked before the writer was in
        // line (readers ahead of it may take their turns after it asked: on etcd one after another).
        const firstAsked = new Map<string, number>();
        for (const x of log.attempts) if (!firstAsked.has(x.owner)) firstAsked.set(x.owner, x.sentAt);
        const passed = log.attempts.filter(
          (x) => x.limit === SHARED && x.acquired && firstAsked.get(x.owner)! > failed.answeredAt! && x.answeredAt! < won.answeredAt!,
        );
        expect(passed).toEqual([]);
      }
    }, 60_000);

    it('counts a lease per holder: an abandoned share comes back after its ttl, the others stay', async () => {
      if (!shared) return;
      const backend = await client();
      const limits = [2];
      // 2 s: the next two calls must come within it, which a loaded three-server ZooKeeper missed at 300 ms.
      expect((await backend.tryAcquire(['lease:k'], 'crashed', 2_000, { limits })).acquired).toBe(true);
      expect((await backend.tryAcquire(['lease:k'], 'alive', 10_000, { limits })).acquired).toBe(true);
      expect((await backend.tryAcquire(['lease:k'], 'third', 10_000, { limits, willWait: false })).acquired).toBe(false);
      await until(async () => (await backend.tryAcquire(['lease:k'], 'third', 10_000, { limits, willWait: false })).acquired, 8_000);
      const state = await backend.inspect('lease:k');
      expect(state?.limit).toBe(2);
      expect(state?.holders?.map((h) => h.owner).sort()).toEqual(['alive', 'third']);
      expect(await backend.extend(['lease:k'], 'crashed', 10_000)).toEqual({ extended: false });
      await backend.release(['lease:k'], 'alive');
      await backend.release(['lease:k'], 'third');
    });

    it('extends and releases each holder on its own', async () => {
      if (!shared) return;
      const backend = await client();
      const limits = [SHARED];
      for (const owner of ['r1', 'r2', 'r3']) expect((await backend.tryAcquire(['own:k'], owner, 5_000, { limits })).acquired).toBe(true);
      expect((await backend.extend(['own:k'], 'r2', 8_000)).extended).toBe(true);
      expect(await backend.extend(['own:k'], 'stranger', 8_000)).toEqual({ extended: false });
      expect(await backend.release(['own:k'], 'stranger')).toBe(false);
      // The one in the middle goes; the others stay.
      expect(await backend.release(['own:k'], 'r2')).toBe(true);
      const owners = async () => (await backend.inspect('own:k'))?.holders?.map((h) => h.owner).sort();
      expect(await owners()).toEqual(['r1', 'r3']);
      expect(await backend.extend(['own:k'], 'r2', 8_000)).toEqual({ extended: false });
      expect(await backend.release(['own:k'], 'r2')).toBe(false);
      expect((await backend.extend(['own:k'], 'r3', 8_000)).extended).toBe(true);
      expect(await backend.release(['own:k'], 'r3')).toBe(true);
      expect(await owners()).toEqual(['r1']);
      expect((await backend.inspect('own:k'))?.owner).toBe('r1');
      expect(await backend.release(['own:k'], 'r1')).toBe(true);
      expect(await backend.inspect('own:k')).toBeUndefined();
    });

    it('orders tokens across kinds: a writer above every earlier reader, readers after it above the writer', async () => {
      if (!shared) return;
      const [a, b] = [await newService(), await newService()];
      if (!a.backend.fencing) return;
      const tokenOf = (h: LockHandle | undefined) => h!.fencingToken!;
      const w1 = await a.acquire('tok');
      const t1 = tokenOf(w1);
      await w1.release();
      const readers = [await a.acquire('tok', { mode: 'shared' }), await b.acquire('tok', { mode: 'shared' })];
      const readerTokens = readers.map(tokenOf);
      for (const t of readerTokens) expect(t).toBeGreaterThan(t1);
      const w2 = b.acquire('tok', { wait: 10_000 });
      for (const r of readers) await r.release();
      const t2 = tokenOf(await w2);
      expect(t2).toBeGreaterThan(Math.max(...readerTokens));
      const later = a.acquire('tok', { mode: 'shared', wait: 10_000 });
      await (await w2).release();
      const t3 = tokenOf(await later);
      expect(t3).toBeGreaterThan(t2);
      const permit = await b.acquire('tok2', { permits: 2 });
      expect(tokenOf(permit)).toBeGreaterThan(t3);
      await permit.release();
      await (await later).release();
      expect([t1, ...readerTokens, t2, t3].every(Number.isSafeInteger)).toBe(true);
    });

    it('refuses callers that disagree on the limit of a key, naming both', async () => {
      if (!shared) return;
      const [a, b] = [await newService(), await newService()];
      const held = await a.acquire('limit', { permits: 3 });
      for (const options of [{ permits: 5 }, { mode: 'shared' as const }]) {
        const error = await b.acquire('limit', { ...options, wait: 5_000 }).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(InvalidLockOptionsError);
        const message = (error as Error).message;
        expect(message).toContain(`${b.options.keyPrefix}limit`);
        expect(message).toContain('3 permits');
        expect(message).toContain('permits' in options ? '5 permits' : 'shared');
      }
      // An exclusive caller disagrees with nobody: it waits for every holder.
      expect(await b.tryAcquire('limit')).toBeUndefined();
      const backend = await client();
      const result = await backend.tryAcquire([`${a.options.keyPrefix}limit`], 'raw', 1_000, { limits: [4], willWait: false });
      expect(result).toEqual({ acquired: false, limitMismatch: { key: `${a.options.keyPrefix}limit`, limit: 3 } });
      await held.release();
    });

    it('takes several keys of different kinds at once, all or nothing, without deadlock', async () => {
      if (!shared) return;
      const [keyA, keyB] = ['mix:a', 'mix:b'].map((key) => target.multiKey?.(key) ?? key);
      const backend = await client();
      const [a, b] = [keyA, keyB].sort();
      expect((await backend.tryAcquire([a, b], 'mixed', 5_000, { limits: [SHARED, 1] })).acquired).toBe(true);
      expect((await backend.tryAcquire([a], 'reader', 5_000, { limits: [SHARED], willWait: false })).acquired).toBe(true);
      expect((await backend.tryAcquire([b], 'writer', 5_000, { willWait: false })).acquired).toBe(false);
      expect((await backend.tryAcquire([a, b], 'other', 5_000, { limits: [1, SHARED], willWait: false })).acquired).toBe(false);
      for (const owner of ['mixed', 'reader']) await backend.release(owner === 'mixed' ? [a, b] : [a], owner);

      const [s1, s2] = [await newService(), await newService()];
      let done = 0;
      await Promise.all(
        Array.from({ length: 24 }, (_, i) =>
          (i % 2 ? s1 : s2)
            .using(
              i % 4 < 2 ? [keyA, keyB] : [keyB, keyA],
              async () => {
                await new Promise((resolve) => setImmediate(resolve));
                done++;
              },
              { wait: 30_000, ...(i % 3 === 0 ? {} : i % 3 === 1 ? { mode: 'shared' as const } : { permits: 2 }) },
            )
            .catch((error: unknown) => {
              // Permits against shared on the same keys disagree: refused, not deadlocked.
              if (!(error instanceof InvalidLockOptionsError)) throw error;
              done++;
            }),
        ),
      );
      expect(done).toBe(24);
    }, 60_000);

    it('wakes only the waiters that can enter when a holder leaves', async () => {
      if (!shared) return;
      const backend = await client();
      if (!backend.watch) return;
      const woken: string[] = [];
      const key = 'herd:k';
      expect((await backend.tryAcquire([key], 'writer', 10_000)).acquired).toBe(true);
      const line = [
        ['r1', SHARED],
        ['r2', SHARED],
        ['w2', 1],
        ['r3', SHARED],
      ] as const;
      const stops: (() => void)[] = [];
      for (const [owner, limit] of line) {
        expect((await backend.tryAcquire([key], owner, 10_000, { limits: [limit] })).acquired).toBe(false);
        stops.push(await backend.watch([key], () => woken.push(owner), owner));
      }
      woken.length = 0;
      await backend.release([key], 'writer');
      await until(() => woken.includes('r1') && woken.includes('r2'), 5_000, 'the readers at the head to be woken');
      for (const owner of ['r1', 'r2']) expect((await backend.tryAcquire([key], owner, 10_000, { limits: [SHARED] })).acquired).toBe(true);
      // A round trip later, still nobody else: the writer behind them cannot enter, nor the reader behind it.
      await backend.inspect(key);
      expect(woken.filter((o) => o !== 'r1' && o !== 'r2')).toEqual([]);
      for (const stop of stops) stop();
      for (const owner of ['r1', 'r2', 'w2', 'r3']) await backend.release([key], owner);
    });
  });
}
