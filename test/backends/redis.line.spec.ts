import { describe, expect, it } from '@jest/globals';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { LockService } from '../../lib/lock.service.js';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import type { RedisLockBackendOptions } from '../../lib/backends/redis/redis.options.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

const fixture = useRedisServer();

function backend(options?: RedisLockBackendOptions): RedisLockBackend {
  const created = new RedisLockBackend(fixture.server.url, options);
  fixture.cleanup(() => created.close());
  return created;
}

/** Whether Redis's clock has reached the deadline (ms) in a waiter's record in the line of `key`. */
async function placeRanOut(key: string, owner: string): Promise<boolean> {
  const record = await fixture.admin.hget(`{${key}}:waiters`, owner);
  const [seconds, micros] = await fixture.admin.time();
  return record === null || Number(seconds) * 1000 + Number(micros) / 1000 >= Number(record.split(' ')[0]);
}

describe('the line of waiters in Redis', () => {
  it('two multi-key waiters never block each other on free keys after one of them lost its place', async () => {
    const b = backend({ waiterTimeout: 1_500 });
    expect((await b.tryAcquire(['a'], 'holder-a', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['b'], 'holder-b', 60_000)).acquired).toBe(true);
    // X and Y wait for both keys, X first. X stops asking (a paused process); Y keeps asking.
    expect((await b.tryAcquire(['a', 'b'], 'x', 60_000)).acquired).toBe(false);
    const askY = async () => expect((await b.tryAcquire(['a', 'b'], 'y', 60_000)).acquired).toBe(false);
    await until(async () => (await askY(), placeRanOut('a', 'x')), 10_000, "x's place to run out");
    // A release of b looks at b's line only, and drops X from it; X is still listed in a's line.
    await b.release(['b'], 'holder-b');
    await askY();
    // X comes back and asks again while a is still held.
    expect((await b.tryAcquire(['a', 'b'], 'x', 60_000)).acquired).toBe(false);
    await b.release(['a'], 'holder-a');

    // Both keys are free: Y, who kept its place while X lost its own, takes them; X goes next.
    const [y, x] = [await b.tryAcquire(['a', 'b'], 'y', 60_000), await b.tryAcquire(['a', 'b'], 'x', 60_000)];
    expect({ y: y.acquired, x: x.acquired }).toEqual({ y: true, x: false });
    await b.release(['a', 'b'], 'y');
    expect((await b.tryAcquire(['a', 'b'], 'x', 60_000)).acquired).toBe(true);
  });

  it('a caller of several keys stands in line up to the first key that keeps it out, and keeps its place there as it moves on', async () => {
    const b = backend({ waiterTimeout: 60_000 });
    expect((await b.tryAcquire(['c'], 'holder-c', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['d'], 'holder-d', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['c', 'd'], 'first', 60_000)).acquired).toBe(false);
    expect(await fixture.admin.zrange('{c}:queue', 0, -1)).toEqual(['first']);
    expect(await fixture.admin.exists('{d}:queue', '{d}:waiters')).toBe(0);
    const place = await fixture.admin.zscore('{c}:queue', 'first');
    expect((await b.tryAcquire(['c'], 'second', 60_000)).acquired).toBe(false);
    expect((await b.tryAcquire(['c', 'd'], 'first', 60_000)).acquired).toBe(false);
    // c is free now, d still held: the first stands in both lines, with its place in c's kept.
    await b.release(['c'], 'holder-c');
    expect((await b.tryAcquire(['c', 'd'], 'first', 60_000)).acquired).toBe(false);
    expect(await fixture.admin.zscore('{c}:queue', 'first')).toBe(place);
    expect(await fixture.admin.zrange('{c}:queue', 0, -1)).toEqual(['first', 'second']);
    expect(await fixture.admin.zrange('{d}:queue', 0, -1)).toEqual(['first']);
    expect((await b.tryAcquire(['c'], 'second', 60_000)).acquired).toBe(false);
  });

  it('a caller of several keys that finds an earlier key taken again leaves the lines after it', async () => {
    const b = backend({ waiterTimeout: 60_000 });
    expect((await b.tryAcquire(['d'], 'holder-d', 60_000)).acquired).toBe(true);
    // c lets x in, d keeps it out: x stands in both lines.
    expect((await b.tryAcquire(['c', 'd'], 'x', 60_000)).acquired).toBe(false);
    expect(await fixture.admin.zscore('{d}:queue', 'x')).not.toBeNull();
    await b.release(['d'], 'holder-d');
    // c is taken while x still has its place in both lines. The line lets nobody pass x, so the
    // test writes the lease itself, as any holder the line did not see would have.
    await fixture.admin.set('c', 'holder-c', 'PX', 60_000);
    // x asks again: c keeps it out now, so it stands in c's line and leaves d's.
    expect((await b.tryAcquire(['c', 'd'], 'x', 60_000)).acquired).toBe(false);
    expect(await fixture.admin.zscore('{c}:queue', 'x')).not.toBeNull();
    expect(await fixture.admin.zscore('{d}:queue', 'x')).toBeNull();
    expect(await fixture.admin.hexists('{d}:waiters', 'x')).toBe(0);
    // The holder of c takes d next.
    expect((await b.tryAcquire(['d'], 'holder-c', 60_000)).acquired).toBe(true);
  });

  /** Another process whose waiters ask again on their own only every 30 s: they enter sooner only when told. */
  function slowPollingProcess(): LockService {
    const service = new LockService(backend({ waiterTimeout: 60_000 }), { keyPrefix: '', pollInterval: 30_000 });
    fixture.cleanup(() => service.onApplicationShutdown());
    return service;
  }

  it('a waiter that a caller of several keys kept out of a free key is told when that caller leaves its line', async () => {
    const b = backend({ waiterTimeout: 60_000 });
    const other = slowPollingProcess();
    expect((await b.tryAcquire(['h'], 'holder-h', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['g', 'h'], 'x', 60_000)).acquired).toBe(false);
    // Another process waits for h behind x, and is told to wait as long as x's place lasts (60 s).
    const entered = other.using('h', async () => 'entered', { wait: 10_000, ttl: 60_000 });
    await until(async () => (await fixture.admin.zcard('{h}:queue')) === 2, 5_000, 'the second waiter in line');
    // h is released: x, first in line, is told to ask again; the waiter behind it is not.
    await b.release(['h'], 'holder-h');
    await fixture.admin.set('g', 'holder-g', 'PX', 60_000);
    // x asks again: g keeps it out, so it leaves h's line, and the waiter it kept out enters.
    expect((await b.tryAcquire(['g', 'h'], 'x', 60_000)).acquired).toBe(false);
    await expect(entered).resolves.toBe('entered');
  });

  it('readers that a caller of several keys kept out are all told when it leaves the line', async () => {
    const b = backend({ waiterTimeout: 60_000 });
    const other = slowPollingProcess();
    expect((await b.tryAcquire(['j'], 'holder-j', 60_000)).acquired).toBe(true);
    expect((await b.tryAcquire(['i', 'j'], 'x', 60_000)).acquired).toBe(false);
    // Two readers wait for j behind x; both must be in together to finish (each waits for the other).
    let inside = 0;
    // The first in gives up after 8 s without the second, which asks again on its own only at its
    // poll (30 s) or when its wait ends (25 s).
    const bothIn = () => until(async () => inside === 2, 8_000, 'both readers inside');
    const read = () => other.using('j', async () => (inside++, await bothIn()), { mode: 'shared', wait: 25_000, ttl: 60_000 });
    const readers = [read(), read()];
    await until(async () => (await fixture.admin.zcard('{j}:queue')) === 3, 5_000, 'two readers in line behind x');
    await b.release(['j'], 'holder-j');
    await fixture.admin.set('i', 'holder-i', 'PX', 60_000);
    // x leaves j's line: both readers at its head are told, not only the first.
    expect((await b.tryAcquire(['i', 'j'], 'x', 60_000)).acquired).toBe(false);
    await Promise.all(readers);
  });

  it('a fractional waiterTimeout is rounded up to whole milliseconds, and waiting works', async () => {
    const b = backend({ waiterTimeout: 2_500.5 });
    expect((await b.tryAcquire(['f'], 'holder', 60_000)).acquired).toBe(true);
    const waiting = await b.tryAcquire(['f'], 'waiter', 60_000);
    expect(waiting).toMatchObject({ acquired: false });
    expect(await fixture.admin.pttl('{f}:queue')).toBeGreaterThan(0);
    await b.release(['f'], 'holder');
    expect(await fixture.admin.get('f')).toBe('waiter');
    expect(await fixture.admin.pttl('f')).toBeLessThanOrEqual(2_501);
  });

  it('hands the lock only to the waiter its process lets try next: many callers of two processes never stall', async () => {
    // Redis hands a released lock to the first of its line and tells that waiter's process; only
    // the first of a process's own queue listens. Were the two orders to differ, the lock would sit
    // with a waiter that is not listening for as long as a handed-over lease lasts (here its whole
    // ttl), and every wait below would run out. Fresh clients: the first requests of a process go
    // out while its connection is still being made.
    for (let trial = 0; trial < 4; trial++) {
      const services = [0, 1].map(() => new LockService(backend({ waiterTimeout: 120_000 }), { keyPrefix: `stall${trial}:` }));
      let sections = 0;
      try {
        await Promise.all(
          Array.from({ length: 40 }, (_, i) =>
            (async () => {
              for (let round = 0; round < 3; round++) {
                await services[i % 2].using(
                  'k',
                  async () => {
                    await new Promise((resolve) => setImmediate(resolve));
                    sections++;
                  },
                  { wait: 5_000, ttl: 60_000 },
                );
              }
            })(),
          ),
        );
      } finally {
        await Promise.all(services.map((service) => service.onApplicationShutdown()));
      }
      expect(sections).toBe(120);
    }
  });

  it("a waiter ahead in Redis's line but not first in its process's queue still takes the lock handed to it", async () => {
    // The first caller's first request fails without reaching Redis (a connection reset), the
    // second caller's reaches it: Redis's line has the second first, the process's queue the first.
    const redis = backend({ waiterTimeout: 120_000 });
    let calls = 0;
    const flaky: LockBackend = Object.assign(Object.create(redis) as LockBackend, {
      tryAcquire: (...args: Parameters<LockBackend['tryAcquire']>) =>
        ++calls === 1 ? Promise.reject(new Error('connection reset (injected)')) : redis.tryAcquire(...args),
    });
    const holder = new LockService(backend({ waiterTimeout: 120_000 }), { keyPrefix: '' });
    const waiters = new LockService(flaky, { keyPrefix: '' });
    fixture.cleanup(() => Promise.all([holder.onApplicationShutdown(), waiters.onApplicationShutdown()]));
    const held = await holder.acquire('k', { ttl: 60_000 });
    const entered: string[] = [];
    const both = ['first', 'second'].map((name) => waiters.using('k', async () => void entered.push(name), { wait: 5_000, ttl: 60_000 }));
    await until(async () => (await fixture.admin.zcard('{k}:queue')) >= 1 && calls >= 3, 5_000, 'both callers to have asked');
    await held.release();
    await Promise.all(both);
    expect(entered.sort()).toEqual(['first', 'second']);
  });
});
