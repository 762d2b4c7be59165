import { describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { SHARED, type AcquireResult } from '../../lib/backends/lock-backend.interface.js';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { lockKeyLayout } from '../../lib/backends/redis/redis.keys.js';
import type { RedisLockBackendOptions } from '../../lib/backends/redis/redis.options.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

/**
 * Shared (read) locks and semaphores on one redis-server, through the backend itself: several
 * holders of a key, each with a lease of its own, in the same fair line as exclusive callers.
 */
const fixture = useRedisServer();
const EXCLUSIVE = 1;

function backend(options?: RedisLockBackendOptions): RedisLockBackend {
  const b = new RedisLockBackend(fixture.server.url, options);
  fixture.cleanup(() => b.close());
  return b;
}

function attempt(b: RedisLockBackend, key: string, owner: string, limit: number, ttl = 60_000): Promise<AcquireResult> {
  return b.tryAcquire([key], owner, ttl, { limits: [limit] });
}

/** Like LockService: tries, and between tries waits for a wake-up from a release (or a short poll). */
async function acquire(b: RedisLockBackend, key: string, owner: string, limit: number, ttl = 60_000): Promise<number> {
  let wake: () => void = () => undefined;
  const stop = await b.watch([key], () => wake(), owner);
  try {
    for (;;) {
      const result = await attempt(b, key, owner, limit, ttl);
      if (result.acquired) return result.fencingToken!;
      if (result.limitMismatch) throw new Error(`limit mismatch: ${JSON.stringify(result.limitMismatch)}`);
      await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, Math.min(result.retryAfterMs ?? 100, 100));
      });
    }
  } finally {
    stop();
  }
}

/** Who holds `key` now, as Redis says: the exclusive owner, or the shared holders. */
async function holdersOf(b: RedisLockBackend, key: string): Promise<string[]> {
  const state = await b.inspect(key);
  if (!state) return [];
  return state.holders ? state.holders.map((h) => h.owner).sort() : [state.owner];
}

describe('Redis backend: shared locks and semaphores', () => {
  it('says it honours limits', () => {
    expect(backend().sharedHolders).toBe(true);
  });

  it('readers hold together; inspect shows each with its own lease', async () => {
    const b = backend();
    expect((await attempt(b, 'doc', 'r1', SHARED, 60_000)).acquired).toBe(true);
    expect((await attempt(b, 'doc', 'r2', SHARED, 30_000)).acquired).toBe(true);
    const state = await b.inspect('doc');
    expect(state).toMatchObject({ key: 'doc', limit: SHARED });
    expect(state!.holders!.map((h) => h.owner).sort()).toEqual(['r1', 'r2']);
    const lease = Object.fromEntries(state!.holders!.map((h) => [h.owner, h.ttlMs]));
    expect(lease.r1).toBeGreaterThan(30_000);
    expect(lease.r2).toBeLessThanOrEqual(30_000);
    expect(await fixture.admin.get('doc')).toBe('*shared');
  });

  it('a writer waits for every reader, and no reader enters beside a writer', async () => {
    const b = backend();
    expect((await attempt(b, 'doc', 'r1', SHARED)).acquired).toBe(true);
    expect((await attempt(b, 'doc', 'w', EXCLUSIVE)).acquired).toBe(false);
    // The plain exclusive call (no limits, the usual case's script path) sees the reader too.
    expect((await b.tryAcquire(['doc'], 'w2', 60_000, { willWait: false })).acquired).toBe(false);
    const writer = acquire(b, 'doc', 'w', EXCLUSIVE);
    await b.release(['doc'], 'r1');
    await writer;
    expect(await holdersOf(b, 'doc')).toEqual(['w']);
    expect((await attempt(b, 'doc', 'r2', SHARED, 60_000)).acquired).toBe(false);
    expect(await holdersOf(b, 'doc')).toEqual(['w']);
  });

  it('two writers never hold together, on a key that readers used', async () => {
    const b = backend();
    expect((await attempt(b, 'doc', 'r1', SHARED)).acquired).toBe(true);
    await b.release(['doc'], 'r1');
    expect((await attempt(b, 'doc', 'w1', EXCLUSIVE)).acquired).toBe(true);
    expect((await attempt(b, 'doc', 'w2', EXCLUSIVE)).acquired).toBe(false);
    expect((await b.tryAcquire(['doc'], 'w3', 60_000)).acquired).toBe(false);
    expect(await holdersOf(b, 'doc')).toEqual(['w1']);
  });

  it('a queued writer keeps later readers out; its release lets all of them in at once', async () => {
    const b = backend();
    expect((await attempt(b, 'doc', 'r1', SHARED)).acquired).toBe(true);
    expect((await attempt(b, 'doc', 'w', EXCLUSIVE)).acquired).toBe(false); // in line
    expect((await attempt(b, 'doc', 'r2', SHARED)).acquired).toBe(false); // behind the writer
    expect((await attempt(b, 'doc', 'r3', SHARED)).acquired).toBe(false);
    expect(await holdersOf(b, 'doc')).toEqual(['r1']);
    await b.release(['doc'], 'r1');
    // Handed to the writer in Redis by the release itself.
    expect(await holdersOf(b, 'doc')).toEqual(['w']);
    await b.release(['doc'], 'w');
    expect(await holdersOf(b, 'doc')).toEqual(['r2', 'r3']);
    expect(await fixture.admin.zcard(lockKeyLayout('doc').line)).toBe(0);
  });

  it('a newcomer never passes a queued writer, even when the readers keep coming', async () => {
    const b = backend();
    expect((await attempt(b, 'doc', 'r0', SHARED)).acquired).toBe(true);
    const writer = acquire(b, 'doc', 'w', EXCLUSIVE);
    await until(async () => (await fixture.admin.zcard(lockKeyLayout('doc').line)) === 1, 5_000, 'the writer to stand in line');
    // A steady stream of readers: none gets in while the writer waits.
    for (let i = 1; i <= 5; i++) expect((await attempt(b, 'doc', `r${i}`, SHARED)).acquired).toBe(false);
    await b.release(['doc'], 'r0');
    await writer;
    expect(await holdersOf(b, 'doc')).toEqual(['w']);
  });

  it('a semaphore admits N, and the N+1th caller waits for a permit', async () => {
    const b = backend();
    for (const owner of ['p1', 'p2', 'p3']) expect((await attempt(b, 'export', owner, 3)).acquired).toBe(true);
    const fourth = await attempt(b, 'export', 'p4', 3);
    expect(fourth.acquired).toBe(false);
    expect((await attempt(b, 'export', 'p5', 3)).acquired).toBe(false);
    expect(await holdersOf(b, 'export')).toEqual(['p1', 'p2', 'p3']);
    expect((await b.inspect('export'))!.limit).toBe(3);
    await b.release(['export'], 'p2');
    // Handed to the first in line only: p5 stays out.
    expect(await holdersOf(b, 'export')).toEqual(['p1', 'p3', 'p4']);
    expect((await attempt(b, 'export', 'p5', 3)).acquired).toBe(false);
  });

  it('many callers on one semaphore: never more than N at once, and every one gets in', async () => {
    const N = 3;
    const processes = [backend(), backend(), backend()];
    let inside = 0;
    let most = 0;
    const tokens: number[] = [];
    await Promise.all(
      Array.from({ length: 24 }, async (_, i) => {
        const b = processes[i % processes.length];
        const owner = `c${i}`;
        for (let round = 0; round < 3; round++) {
          tokens.push(await acquire(b, 'sem', owner, N));
          inside++;
          most = Math.max(most, inside);
          await new Promise((resolve) => setTimeout(resolve, 1 + (i % 3))); // work inside, not synchronisation
          inside--;
          expect(await b.release(['sem'], owner)).toBe(true);
        }
      }),
    );
    expect(most).toBeLessThanOrEqual(N);
    expect(most).toBe(N);
    expect(new Set(tokens).size).toBe(tokens.length);
    // Nothing is left once every holder is gone.
    expect(await fixture.admin.dbsize()).toBeLessThanOrEqual(1); // at most the fencing counter
  });

  it('permits of another number, or permits against shared, are a mismatch the caller hears at once', async () => {
    const b = backend();
    expect((await attempt(b, 'sem', 'p1', 3)).acquired).toBe(true);
    expect(await attempt(b, 'sem', 'p2', 5)).toEqual({ acquired: false, limitMismatch: { key: 'sem', limit: 3 } });
    expect(await attempt(b, 'sem', 'r', SHARED)).toEqual({ acquired: false, limitMismatch: { key: 'sem', limit: 3 } });
    expect((await attempt(b, 'doc', 'r', SHARED)).acquired).toBe(true);
    expect(await attempt(b, 'doc', 'p', 2)).toEqual({ acquired: false, limitMismatch: { key: 'doc', limit: SHARED } });
    // An exclusive caller is no mismatch: it waits.
    const exclusive = await attempt(b, 'doc', 'w', EXCLUSIVE);
    expect(exclusive.acquired).toBe(false);
    expect('limitMismatch' in exclusive).toBe(false);
    // Nobody with a mismatch joined the line.
    expect(await fixture.admin.zrange(lockKeyLayout('sem').line, 0, -1)).toEqual([]);
  });

  it('each holder has its own lease: one that stops extending leaves, the others stay', async () => {
    const b = backend();
    expect((await attempt(b, 'sem', 'short', 2, 300)).acquired).toBe(true);
    expect((await attempt(b, 'sem', 'long', 2, 60_000)).acquired).toBe(true);
    expect((await attempt(b, 'sem', 'third', 2)).acquired).toBe(false);
    const third = acquire(b, 'sem', 'third', 2);
    await third; // when the short lease ran out, by Redis's clock
    expect(await holdersOf(b, 'sem')).toEqual(['long', 'third']);
    expect(await b.extend(['sem'], 'short', 60_000)).toEqual({ extended: false });
    expect(await b.extend(['sem'], 'long', 60_000)).toEqual({ extended: true });
    expect(await holdersOf(b, 'sem')).toEqual(['long', 'third']);
  });

  it("a holder's lease lasts its whole ttl from when it asked, by the server's clock to the µs", async () => {
    // The server's ms drop the µs: an end counted from them, ended as soon as the clock reaches it,
    // was up to a ms short, and the store freed a permit while its holder's lease (counted from
    // before it asked) still ran.
    const b = backend();
    const serverMs = async () => {
      const [seconds, micros] = await fixture.admin.time();
      return Number(seconds) * 1000 + Number(micros) / 1000;
    };
    const { holders } = lockKeyLayout('sem');
    for (let round = 0; round < 20; round++) {
      const owner = `p${round}`;
      const asked = await serverMs();
      expect((await attempt(b, 'sem', owner, 2, 1_000)).acquired).toBe(true);
      // Over once the server's ms reach the end: not before `ttl` from the ask.
      expect(Number(await fixture.admin.zscore(holders, owner))).toBeGreaterThanOrEqual(asked + 1_000);
      const extendedAt = await serverMs();
      expect(await b.extend(['sem'], owner, 2_000)).toEqual({ extended: true });
      expect(Number(await fixture.admin.zscore(holders, owner))).toBeGreaterThanOrEqual(extendedAt + 2_000);
      expect(await b.release(['sem'], owner)).toBe(true);
    }
  });

  it('an extension renews its holder alone, and the key lives as long as its longest lease', async () => {
    const b = backend();
    expect((await attempt(b, 'doc', 'r1', SHARED, 2_000)).acquired).toBe(true);
    expect((await attempt(b, 'doc', 'r2', SHARED, 2_000)).acquired).toBe(true);
    expect(await b.extend(['doc'], 'r1', 60_000)).toEqual({ extended: true });
    const layout = lockKeyLayout('doc');
    expect(await fixture.admin.pttl('doc')).toBeGreaterThan(50_000);
    expect(await fixture.admin.pttl(layout.holders)).toBeGreaterThan(50_000);
    const lease = Object.fromEntries((await b.inspect('doc'))!.holders!.map((h) => [h.owner, h.ttlMs]));
    expect(lease.r2).toBeLessThanOrEqual(2_000);
    // A fresh backend (it never saw r1 acquire) still extends and releases r1's share.
    const other = backend();
    expect(await other.extend(['doc'], 'r1', 60_000)).toEqual({ extended: true });
    expect(await other.release(['doc'], 'r1')).toBe(true);
    expect(await holdersOf(b, 'doc')).toEqual(['r2']);
    expect(await fixture.admin.pttl('doc')).toBeLessThanOrEqual(2_000);
  });

  it('fencing tokens come from one counter for every kind, and increase across kinds', async () => {
    const b = backend();
    const r1 = (await attempt(b, 'doc', 'r1', SHARED)) as { fencingToken: number };
    const r2 = (await attempt(b, 'doc', 'r2', SHARED)) as { fencingToken: number };
    expect(r2.fencingToken).toBeGreaterThan(r1.fencingToken);
    const writer = acquire(b, 'doc', 'w', EXCLUSIVE);
    await until(async () => (await fixture.admin.zcard(lockKeyLayout('doc').line)) === 1, 5_000, 'the writer to stand in line');
    const readers = [acquire(b, 'doc', 'r3', SHARED), acquire(b, 'doc', 'r4', SHARED)];
    await until(async () => (await fixture.admin.zcard(lockKeyLayout('doc').line)) === 3, 5_000, 'the readers to stand in line');
    await b.release(['doc'], 'r1');
    await b.release(['doc'], 'r2');
    const w = await writer;
    expect(w).toBeGreaterThan(r2.fencingToken);
    await b.release(['doc'], 'w');
    const [r3, r4] = await Promise.all(readers);
    expect(Math.min(r3, r4)).toBeGreaterThan(w);
    expect(r3).not.toBe(r4);
    await b.release(['doc'], 'r3');
    await b.release(['doc'], 'r4');
    const p = (await attempt(b, 'doc', 'p', 2)) as { fencingToken: number };
    expect(p.fencingToken).toBeGreaterThan(Math.max(r3, r4));
    const plain = await b.tryAcquire(['doc2'], 'x', 60_000);
    expect(plain.acquired).toBe(true);
  });

  it('a release wakes exactly the waiters that can now enter', async () => {
    const b = backend();
    const listener = new Redis(fixture.server.port, '127.0.0.1');
    fixture.cleanup(() => listener.disconnect());
    const told: string[] = [];
    await listener.psubscribe('nest-distributed-lock:*');
    listener.on('pmessage', (_pattern, _channel, message: string) => told.push(message.split(' ')[0]));

    expect((await attempt(b, 'doc', 'w1', EXCLUSIVE)).acquired).toBe(true);
    for (const [owner, limit] of [
      ['r1', SHARED],
      ['r2', SHARED],
      ['w2', EXCLUSIVE],
      ['r3', SHARED],
    ] as const) {
      expect((await attempt(b, 'doc', owner, limit)).acquired).toBe(false);
    }
    await b.release(['doc'], 'w1');
    expect(await holdersOf(b, 'doc')).toEqual(['r1', 'r2']);
    await until(() => told.length >= 2, 5_000, 'the readers to be told');
    await b.release(['doc'], 'r1');
    // r1 left, r2 still holds: nobody can enter, nobody is told.
    expect(await holdersOf(b, 'doc')).toEqual(['r2']);
    await b.release(['doc'], 'r2');
    expect(await holdersOf(b, 'doc')).toEqual(['w2']);
    await until(() => told.length >= 3, 5_000, 'the writer to be told');
    await fixture.admin.ping();
    expect(told).toEqual(['r1', 'r2', 'w2']);
  });

  it('mixes kinds per key in one multi-key call', async () => {
    const b = backend();
    expect((await b.tryAcquire(['a', 'b'], 'm1', 60_000, { limits: [EXCLUSIVE, SHARED] })).acquired).toBe(true);
    expect((await b.tryAcquire(['b'], 'r', 60_000, { limits: [SHARED] })).acquired).toBe(true);
    expect((await b.tryAcquire(['a'], 'w', 60_000, { willWait: false })).acquired).toBe(false);
    expect(await holdersOf(b, 'b')).toEqual(['m1', 'r']);
    expect(await b.extend(['a', 'b'], 'm1', 60_000)).toEqual({ extended: true });
    expect(await b.release(['a', 'b'], 'm1')).toBe(true);
    expect(await holdersOf(b, 'a')).toEqual([]);
    expect(await holdersOf(b, 'b')).toEqual(['r']);
  });

  it('keeps nothing of a key once its holders are gone or their leases ran out', async () => {
    const b = backend();
    expect((await attempt(b, 'gone', 'r1', SHARED, 400)).acquired).toBe(true);
    expect((await attempt(b, 'gone', 'r2', SHARED, 400)).acquired).toBe(true);
    await b.release(['gone'], 'r1');
    // Every key of it (the lock, the holder set, the counter) expires with the longest lease (whose
    // end, in the server's whole ms, is one ms on: see leaseEnd).
    for (const key of await fixture.admin.keys('*')) expect(await fixture.admin.pttl(key)).toBeLessThanOrEqual(401);
    await until(async () => (await fixture.admin.dbsize()) === 0, 5_000, 'every key to expire');
  });
});

describe('what a shared holder leaves in Redis', () => {
  it("a reader whose lease ran out leaves nothing of itself, not even who it was, while others keep the key (docs/security.md's bound)", async () => {
    const b = backend();
    // Readers that took the key for 150 ms and stopped (no release, no extension) while 'keeper'
    // holds it throughout and extends its lease.
    const keeper = await b.tryAcquire(['s2'], 'keeper', 1_000, { limits: [SHARED], holder: { instance: 'keeper' } });
    expect(keeper.acquired).toBe(true);
    for (let i = 0; i < 20; i++) {
      const r = await b.tryAcquire(['s2'], `gone-${i}`, 150, { limits: [SHARED], holder: { instance: `gone-${i}`, site: 'X.y' } });
      expect(r.acquired).toBe(true);
    }
    const [seconds] = await fixture.admin.time();
    const lapsed = async () => Number((await fixture.admin.time())[0]) * 1000 > Number(seconds) * 1000 + 1_200;
    // Extended until every other lease has run out by Redis's clock.
    await until(
      async () => (await b.extend(['s2'], 'keeper', 1_000)).extended && (await lapsed()),
      10_000,
      "the readers' leases to run out",
    );
    expect((await b.extend(['s2'], 'keeper', 1_000)).extended).toBe(true);
    expect((await b.inspect('s2'))?.holders?.map((h) => h.owner)).toEqual(['keeper']);
    expect(await fixture.admin.hkeys(lockKeyLayout('s2').who)).toEqual(['keeper']);
  });
});
