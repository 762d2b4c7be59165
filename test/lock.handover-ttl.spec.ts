import { describe, expect, it } from '@jest/globals';
import type { LockBackend } from '../lib/backends/lock-backend.interface.js';
import { PostgresLockBackend } from '../lib/backends/postgres/postgres.backend.js';
import { RedisLockBackend } from '../lib/backends/redis/redis.backend.js';
import { LockService } from '../lib/lock.service.js';
import { usePostgresServer } from './support/postgres-fixture.js';
import { useRedisServer } from './support/redis-fixture.js';
import { until } from './support/wait.js';

// With autoExtend off, nothing extends a lease after the holder starts: the lease must be the ttl
// the caller asked for, also when the lock was handed over on release (the store then grants at
// most its waiterTimeout). Two LockServices on two backends stand for two processes on one store.
const WAITER_TIMEOUT = 4_000;
const TTL = 7_000;

/**
 * The backend as it is, every call to it made on it, with a record of the waiter's attempts: how
 * many are out, and whether it listens for releases yet.
 */
function recorded(backend: LockBackend): { backend: LockBackend; asleep: () => boolean } {
  let out = 0;
  let attempts = 0;
  let watching = false;
  const overrides: Partial<LockBackend> = {
    tryAcquire: (...args) => {
      out++;
      attempts++;
      return backend.tryAcquire(...args).finally(() => out--);
    },
    watch: async (...args) => {
      const stop = await backend.watch!(...args);
      watching = true;
      return stop;
    },
  };
  const proxy = new Proxy(backend, {
    get(target, name) {
      if (name in overrides) return overrides[name as keyof LockBackend];
      const value = Reflect.get(target, name, target) as unknown;
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
  return { backend: proxy, asleep: () => attempts > 0 && watching && out === 0 };
}

async function handOver(first: LockService, second: LockService, asleep: () => boolean, remaining: () => Promise<number>): Promise<void> {
  const held = await first.acquire('report', { ttl: TTL, autoExtend: false });
  const next = second.acquire('report', { ttl: TTL, autoExtend: false, wait: 30_000 });
  // The second process stands in the store's line and sleeps until it hears the release (its
  // next poll is seconds away): the lock comes to it with the release, as the store hands it over.
  await until(asleep, 10_000, 'the second process to wait for the release');
  await held.release();
  const handle = await next;
  // Before the holder runs, the store keeps the key for the ttl asked, not for the waiterTimeout.
  expect(await remaining()).toBeGreaterThan(WAITER_TIMEOUT);
  expect(handle.expiresAt.getTime() - Date.now()).toBeGreaterThan(WAITER_TIMEOUT);
  await handle.release();
}

function service(backend: LockBackend, cleanup: (step: () => unknown) => void): LockService {
  const locks = new LockService(backend, { keyPrefix: '', pollInterval: 3_000 });
  cleanup(() => locks.onApplicationShutdown());
  return locks;
}

describe('a lock handed over on release, autoExtend off: the lease is the ttl asked', () => {
  describe('Redis', () => {
    const fixture = useRedisServer();

    it('gives the second process the whole ttl, not the waiterTimeout', async () => {
      const connect = (): LockBackend => new RedisLockBackend(fixture.server.url, { waiterTimeout: WAITER_TIMEOUT });
      const waiter = recorded(connect());
      const remaining = (): Promise<number> => fixture.admin.pttl('report');
      await handOver(service(connect(), fixture.cleanup), service(waiter.backend, fixture.cleanup), waiter.asleep, remaining);
    });
  });

  describe('PostgreSQL', () => {
    const fixture = usePostgresServer();

    it('gives the second process the whole ttl, not the waiterTimeout', async () => {
      const connect = (): LockBackend => new PostgresLockBackend(fixture.url, { waiterTimeout: WAITER_TIMEOUT });
      const waiter = recorded(connect());
      const remaining = async (): Promise<number> => {
        const sql = 'SELECT extract(epoch FROM expires_at - clock_timestamp()) * 1000 AS ms FROM distributed_locks WHERE key = $1';
        return Number((await fixture.admin.query<{ ms: string }>(sql, ['report'])).rows[0]?.ms ?? 0);
      };
      await handOver(service(connect(), fixture.cleanup), service(waiter.backend, fixture.cleanup), waiter.asleep, remaining);
    });
  });
});
