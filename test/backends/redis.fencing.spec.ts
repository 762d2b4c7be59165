import { afterEach, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import type { RedisLockBackendOptions } from '../../lib/backends/redis/redis.options.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

// Redis's default persistence (RDB snapshots, or AOF fsynced every second) loses the last writes
// on a crash, and a replica promoted on failover may lag its master the same way: the fencing
// counters come back older than the tokens already handed out.

// Emptied by hand: the snapshot must be emptied too. A connection per use, as the server restarts.
const fixture = useRedisServer({ flush: false });
const open: RedisLockBackend[] = [];

afterEach(async () => {
  await Promise.all(open.splice(0).map((b) => b.close()));
  await admin((redis) => redis.flushall());
  await admin((redis) => redis.save());
});

async function admin<T>(work: (redis: Redis) => Promise<T>): Promise<T> {
  const redis = new Redis(fixture.server.port, '127.0.0.1');
  try {
    return await work(redis);
  } finally {
    redis.disconnect();
  }
}

function backend(options?: RedisLockBackendOptions): RedisLockBackend {
  const created = new RedisLockBackend(fixture.server.url, options);
  open.push(created);
  return created;
}

async function tokenOf(b: RedisLockBackend, keys: string[], owner: string): Promise<number> {
  const result = await b.tryAcquire(keys, owner, 60_000, { willWait: false });
  if (!result.acquired) throw new Error(`${keys.join(', ')} should have been free for ${owner}`);
  await b.release(keys, owner);
  return result.fencingToken!;
}

/** SIGKILL, then start again from the snapshot SAVE wrote: every write after it is lost. */
async function crashAndRestoreSnapshot(): Promise<void> {
  await Promise.all(open.splice(0).map((b) => b.close()));
  await fixture.server.kill();
  await fixture.server.restart();
}

describe('fencing tokens after Redis restarts from an older snapshot', () => {
  it('a single-key acquisition gets a token above every token issued before the crash', async () => {
    const before = backend();
    const saved = await tokenOf(before, ['k'], 'o1');
    await admin((redis) => redis.save());
    const lost = [await tokenOf(before, ['k'], 'o2'), await tokenOf(before, ['k'], 'o3'), await tokenOf(before, ['k'], 'o4')];
    await crashAndRestoreSnapshot();
    expect(Number(await admin((redis) => redis.get('{k}:fence')))).toBe(saved);

    const token = await tokenOf(backend(), ['k'], 'o5');
    expect(token).toBeGreaterThan(Math.max(...lost));
  });

  it('a multi-key acquisition gets a token above every token issued for any of its keys before the crash', async () => {
    const before = backend();
    await tokenOf(before, ['a', 'b'], 'o1');
    await admin((redis) => redis.save());
    const lost = [await tokenOf(before, ['a'], 'o2'), await tokenOf(before, ['a', 'b'], 'o3'), await tokenOf(before, ['b'], 'o4')];
    await crashAndRestoreSnapshot();

    const token = await tokenOf(backend(), ['a', 'b'], 'o5');
    expect(token).toBeGreaterThan(Math.max(...lost));
  });

  it('a lock handed over on release gets a token above every token issued before the crash', async () => {
    // The waiter's place must outlive the test, so the restored line still names it.
    const options = { waiterTimeout: 60_000 };
    const before = backend(options);
    expect((await before.tryAcquire(['h'], 'holder', 60_000)).acquired).toBe(true);
    expect((await before.tryAcquire(['h'], 'waiter', 60_000)).acquired).toBe(false);
    await admin((redis) => redis.save());
    // After the snapshot: the holder hands over to the waiter, and others take the lock after it.
    await before.release(['h'], 'holder');
    const lost = [(await before.inspect('h'))!.fencingToken!];
    await before.release(['h'], 'waiter');
    lost.push(await tokenOf(before, ['h'], 'o1'), await tokenOf(before, ['h'], 'o2'));
    await crashAndRestoreSnapshot();
    expect(await admin((redis) => redis.get('h'))).toBe('holder');

    const after = backend(options);
    expect(await after.release(['h'], 'holder')).toBe(true);
    const state = await after.inspect('h');
    expect(state).toMatchObject({ owner: 'waiter' });
    expect(state!.fencingToken).toBeGreaterThan(Math.max(...lost));
  });
});

describe('fencing tokens of shared holders after Redis restarts from an older snapshot', () => {
  async function sharedToken(b: RedisLockBackend, owner: string, limit: number): Promise<number> {
    const result = await b.tryAcquire(['s'], owner, 60_000, { limits: [limit], willWait: false });
    if (!result.acquired) throw new Error(`s should have been free for ${owner}`);
    return result.fencingToken!;
  }

  it('readers, permit holders and writers after the crash get tokens above every token issued before it', async () => {
    const before = backend();
    await sharedToken(before, 'r0', Number.POSITIVE_INFINITY);
    await admin((redis) => redis.save());
    // After the snapshot: readers beside each other, then a writer, then permit holders.
    const lost = [await sharedToken(before, 'r1', Number.POSITIVE_INFINITY), await sharedToken(before, 'r2', Number.POSITIVE_INFINITY)];
    for (const owner of ['r0', 'r1', 'r2']) await before.release(['s'], owner);
    lost.push(await tokenOf(before, ['s'], 'w'), await sharedToken(before, 'p1', 2), await sharedToken(before, 'p2', 2));
    await crashAndRestoreSnapshot();
    // The snapshot still has r0 as a reader: readers join it, and their tokens are above the lost ones.
    const after = backend();
    const reader = await sharedToken(after, 'r3', Number.POSITIVE_INFINITY);
    expect(reader).toBeGreaterThan(Math.max(...lost));
    await after.release(['s'], 'r0');
    await after.release(['s'], 'r3');
    expect(await tokenOf(after, ['s'], 'w2')).toBeGreaterThan(reader);
  });
});

describe('what a lock leaves in Redis', () => {
  it('keeps nothing of a key once its lock is released and its lease would have run out', async () => {
    // One request per distinct key (random ids, mostly unknown ones) must not cost Redis memory
    // for longer than the lock itself could have lived.
    const b = backend();
    const ttl = 1_000;
    for (let i = 0; i < 50; i++) {
      expect((await b.tryAcquire([`product:${i}`], `owner-${i}`, ttl, { willWait: false })).acquired).toBe(true);
      await b.release([`product:${i}`], `owner-${i}`);
    }
    // Multi-key and handed-over tokens too.
    expect((await b.tryAcquire(['pair:a', 'pair:b'], 'pair', ttl, { willWait: false })).acquired).toBe(true);
    expect((await b.tryAcquire(['pair:a'], 'next', ttl)).acquired).toBe(false);
    await b.release(['pair:a', 'pair:b'], 'pair');
    await b.release(['pair:a'], 'next');
    for (const key of await admin((redis) => redis.keys('*'))) {
      expect(await admin((redis) => redis.pttl(key))).toBeLessThanOrEqual(ttl);
    }
    await until(async () => (await admin((redis) => redis.dbsize())) === 0, 5_000, 'every key to be gone');
  });
});
