import { describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { releaseHolders } from '../../lib/forced-release.js';
import { LockService } from '../../lib/lock.service.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

const fixture = useRedisServer();

/** Every page of a listing, joined. */
async function listAll(locks: LockService, limit: number): Promise<string[]> {
  const keys: string[] = [];
  let cursor: string | undefined;
  do {
    const page = await locks.list({ limit, cursor });
    keys.push(...page.keys);
    cursor = page.cursor;
  } while (cursor !== undefined);
  return keys;
}

describe('Redis list()', () => {
  it('lists locks only, never their companions, even with no keyPrefix at all, and with a client keyPrefix', async () => {
    for (const clientPrefix of ['', 'app:']) {
      const client = new Redis(fixture.server.port, '127.0.0.1', { keyPrefix: clientPrefix });
      const backend = new RedisLockBackend(client);
      const locks = new LockService(backend, { keyPrefix: '' });
      fixture.cleanup(() => client.disconnect());
      fixture.cleanup(() => locks.onApplicationShutdown());
      // Plain keys, a hash tag of its own, a '}' (companions under a stand-in tag), a waiter's line and
      // a shared key's holder set: every kind of companion exists.
      const keys = ['order:1', 'order:{42}:pay', 'odd}key', 'shared'];
      const held = [];
      for (const key of keys.slice(0, 3)) held.push(await locks.acquire(key, { site: 'Test.list' }));
      held.push(await locks.acquire('shared', { mode: 'shared' }));
      await expect(locks.acquire('order:1', { wait: 0 })).rejects.toThrow();
      expect((await fixture.admin.keys('*')).length).toBeGreaterThan(keys.length);
      expect((await listAll(locks, 2)).sort()).toEqual([...keys].sort());
      for (const handle of held) await handle.release();
      expect(await listAll(locks, 2)).toEqual([]);
      await fixture.admin.flushall();
    }
  });
});

describe('inspect() on Redis, as the lock board uses it', () => {
  it('tells an exclusive holder its token past its first ttl, so a forced release naming it spares the holder after it', async () => {
    const service = (instance: string) => {
      const locks = new LockService(new RedisLockBackend(fixture.server.url), { ttl: 300, instance });
      fixture.cleanup(() => locks.onApplicationShutdown());
      return locks;
    };
    const [a, b] = [service('a'), service('b')];
    const handle = await a.acquire('kept');
    // Held through several extensions: the first lease (and its counter's own expiry) long past.
    const started = performance.now();
    await until(() => performance.now() - started > 1_000, 5_000, 'three ttls to pass');
    expect(handle.isHeld).toBe(true);
    const seen = (await a.inspect('kept'))?.holders[0].fencingToken;
    expect(seen).toBe(handle.fencingToken);
    // The holder the operator saw leaves and another takes the key; the board then sends the token it showed.
    await handle.release();
    const next = await b.acquire('kept');
    expect(await releaseHolders(a, 'kept', { fencingToken: seen! })).toEqual([]);
    expect(next.isHeld).toBe(true);
    expect((await b.inspect('kept'))?.holders[0].fencingToken).toBe(next.fencingToken);
    await next.release();
  });
});
