import { describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import type { RedisLockBackendOptions } from '../../lib/backends/redis/redis.options.js';
import { LockHandle } from '../../lib/lock.handle.js';
import { LockService } from '../../lib/lock.service.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

/**
 * A lock released while a waiter of the same process (the same backend) is next goes to that
 * waiter in the release's own answer, without a message through Redis. Two backends stand for two
 * processes: each has its own wake-up channel and its own place in the lines.
 */
describe('Redis backend: hand-over inside one process', () => {
  const fixture = useRedisServer();

  function backend(options?: RedisLockBackendOptions): RedisLockBackend {
    const created = new RedisLockBackend(fixture.server.url, { waiterTimeout: 60_000, ...options });
    fixture.cleanup(() => created.close());
    return created;
  }

  function service(b: RedisLockBackend): LockService {
    const locks = new LockService(b, { keyPrefix: '', pollInterval: 20_000 });
    fixture.cleanup(() => locks.onApplicationShutdown());
    return locks;
  }

  /** Every message published on any wake-up channel, from now on. */
  async function wakeUps(): Promise<string[]> {
    const listener = new Redis(fixture.server.port, '127.0.0.1');
    fixture.cleanup(() => listener.disconnect());
    const heard: string[] = [];
    listener.on('pmessage', (_pattern: string, _channel: string, message: string) => heard.push(message));
    await listener.psubscribe('nest-distributed-lock:*');
    return heard;
  }

  async function evalshaCalls(): Promise<number> {
    const stats = await fixture.admin.info('commandstats');
    return Number(/^cmdstat_evalsha:calls=(\d+)/m.exec(stats)?.[1] ?? 0);
  }

  it('goes to the waiter of the same process in the release answer: no message, no request of its own, a greater token', async () => {
    const b = backend();
    const heard = await wakeUps();
    const held = await b.tryAcquire(['h:k'], 'holder', 30_000);
    expect((await b.tryAcquire(['h:k'], 'waiter', 30_000)).acquired).toBe(false);
    expect(await b.release(['h:k'], 'holder')).toBe(true);
    const before = await evalshaCalls();
    const taken = await b.tryAcquire(['h:k'], 'waiter', 30_000);
    expect(await evalshaCalls()).toBe(before); // the attempt sent nothing
    expect(taken).toMatchObject({ acquired: true });
    expect((taken as { fencingToken: number }).fencingToken).toBeGreaterThan((held as { fencingToken: number }).fencingToken);
    expect(await fixture.admin.get('h:k')).toBe('waiter');
    // The lease handed over is the waiter's ttl, capped by waiterTimeout: reset, not the holder's rest.
    expect(await fixture.admin.pttl('h:k')).toBeGreaterThan(29_000);
    expect(await fixture.admin.zcard('{h:k}:queue')).toBe(0);
    expect(heard).toEqual([]);
  });

  it('an attempt sent while the release is out waits for its answer and takes the lock from it', async () => {
    const b = backend();
    await b.tryAcquire(['h:flight'], 'holder', 30_000);
    expect((await b.tryAcquire(['h:flight'], 'waiter', 30_000)).acquired).toBe(false);
    const before = await evalshaCalls();
    const [released, taken] = await Promise.all([b.release(['h:flight'], 'holder'), b.tryAcquire(['h:flight'], 'waiter', 30_000)]);
    expect(released).toBe(true);
    expect(taken.acquired).toBe(true);
    expect(await evalshaCalls()).toBe(before + 1); // the release alone: one round trip for the hand-over
  });

  it('keeps arrival order across processes: a waiter of another process that came first goes first', async () => {
    const [here, there] = [backend(), backend()];
    const heard = await wakeUps();
    await here.tryAcquire(['h:order'], 'holder', 30_000);
    expect((await there.tryAcquire(['h:order'], 'other', 30_000)).acquired).toBe(false);
    expect((await here.tryAcquire(['h:order'], 'local', 30_000)).acquired).toBe(false);
    await here.release(['h:order'], 'holder');
    expect(await fixture.admin.get('h:order')).toBe('other');
    await until(() => heard.length > 0, 5_000, 'the message to the other process');
    expect(heard[0]).toMatch(/^other \d+ \d+$/);
    expect((await here.tryAcquire(['h:order'], 'local', 30_000)).acquired).toBe(false);
    // Its own release then goes to the local waiter of the first process, by message.
    expect((await there.tryAcquire(['h:order'], 'other', 30_000)).acquired).toBe(true);
    await there.release(['h:order'], 'other');
    expect(await fixture.admin.get('h:order')).toBe('local');
  });

  it('with localHandoffs, waiters of the releasing process go first that many times in a row, then the earlier waiter of another', async () => {
    const [here, there] = [backend({ localHandoffs: 2 }), backend()];
    const heard = await wakeUps();
    await here.tryAcquire(['h:cohort'], 'holder', 30_000);
    expect((await there.tryAcquire(['h:cohort'], 'other', 30_000)).acquired).toBe(false);
    const holders = ['holder'];
    for (const next of ['local-1', 'local-2', 'local-3']) {
      expect((await here.tryAcquire(['h:cohort'], next, 30_000)).acquired).toBe(false);
      await here.release(['h:cohort'], holders.at(-1)!);
      const owner = (await fixture.admin.get('h:cohort'))!;
      holders.push(owner);
      if (owner !== next) break;
      expect((await here.tryAcquire(['h:cohort'], next, 30_000)).acquired).toBe(true);
    }
    // Two hand-overs passed the other process's waiter; the third release kept the order.
    expect(holders).toEqual(['holder', 'local-1', 'local-2', 'other']);
    await until(() => heard.length > 0, 5_000, 'the message to the other process');
    expect(heard).toHaveLength(1);
    // local-3 is still in line, first now; the count starts again after a hand-over to another process.
    expect(await fixture.admin.zrange('{h:cohort}:queue', 0, -1)).toEqual(['local-3']);
  });

  it('localHandoffs is checked: a whole number from 0 to 1000', () => {
    for (const bad of [-1, 1.5, 1_001, '2', Number.NaN]) {
      expect(() => new RedisLockBackend(fixture.server.url, { localHandoffs: bad as number })).toThrow(
        /option 'localHandoffs' must be a whole number from 0 to 1000/,
      );
    }
  });

  it('a waiter that gives up as the lock is handed to it does not keep it: another process takes it at once', async () => {
    for (const when of ['same tick', 'next tick', 'after the answer'] as const) {
      const key = `h:abort:${when.replace(/ /g, '-')}`;
      const [here, there] = [service(backend()), service(backend())];
      const held = await here.acquire(key, { ttl: 60_000 });
      const controller = new AbortController();
      const waiting = here.acquire(key, { wait: 30_000, ttl: 60_000, signal: controller.signal });
      // Its attempt failed: it stands in Redis's line, first.
      await until(async () => (await fixture.admin.zcard(`{${key}}:queue`)) === 1, 5_000, 'the waiter to stand in line');
      const releasing = held.release();
      if (when === 'same tick') controller.abort();
      else if (when === 'next tick') await Promise.resolve().then(() => controller.abort());
      else await releasing.then(() => controller.abort());
      await releasing;
      const outcome = await waiting.then(
        (handle) => handle,
        (error: unknown) => error as { name: string },
      );
      // The abort came after it entered: a holder like any other, which lets go.
      if (outcome instanceof LockHandle) await outcome.release();
      else expect(outcome.name).toBe('AbortError');
      // Handed a lease of 60 s: were it kept by the waiter that left, this would wait that long.
      const started = performance.now();
      const other = await there.acquire(key, { wait: 5_000, ttl: 10_000 });
      expect(performance.now() - started).toBeLessThan(4_000);
      expect(await fixture.admin.get(key)).toBe(other.leases[0].owner);
      await other.release();
    }
  });

  it('a release whose answer comes late (Redis stalled past commandTimeout): the waiter still enters, once, with a greater token', async () => {
    const b = backend({ commandTimeout: 300 });
    const locks = service(b);
    const held = await locks.acquire('h:late', { ttl: 30_000 });
    let inside = 0;
    const entered = locks.using(
      'h:late',
      (lock) => {
        inside++;
        return lock.fencingToken;
      },
      { wait: 20_000, ttl: 30_000 },
    );
    await until(async () => (await fixture.admin.zcard('{h:late}:queue')) === 1, 5_000, 'the waiter to stand in line');
    fixture.server.pause();
    // The release times out while its request sits in Redis; the waiter's next attempt queues behind it.
    await expect(held.release()).rejects.toThrow(/did not answer within 300 ms/);
    await new Promise((resolve) => setTimeout(resolve, 500)); // the stall itself, not synchronisation
    fixture.server.resume();
    const resumed = performance.now();
    const token = await entered;
    // Woken by the late answer itself, not by its next poll (20 s away).
    expect(performance.now() - resumed).toBeLessThan(5_000);
    expect(inside).toBe(1);
    expect(token).toBeGreaterThan(held.fencingToken!);
    await until(async () => (await fixture.admin.exists('h:late')) === 0, 5_000, 'the lock to be freed after the section');
  });

  it('callers of two processes with localHandoffs: never two inside, tokens strictly increasing, every waiter served', async () => {
    const services = [service(backend({ localHandoffs: 3 })), service(backend({ localHandoffs: 3 }))];
    let inside = 0;
    const tokens: number[] = [];
    const served: number[] = [];
    await Promise.all(
      Array.from({ length: 8 }, (_, caller) =>
        (async () => {
          for (let round = 0; round < 15; round++) {
            await services[caller % 2].using(
              'h:mixed',
              async (lock) => {
                expect(++inside).toBe(1);
                tokens.push(lock.fencingToken!);
                await new Promise((resolve) => setTimeout(resolve, 1));
                inside--;
              },
              { wait: 20_000, ttl: 30_000 },
            );
            served.push(caller);
          }
        })(),
      ),
    );
    expect(served).toHaveLength(120);
    for (let i = 1; i < tokens.length; i++) expect(tokens[i]).toBeGreaterThan(tokens[i - 1]);
  });
});
