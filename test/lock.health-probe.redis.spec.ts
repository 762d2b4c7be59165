import { describe, expect, it } from '@jest/globals';
import { RedisLockBackend } from '../lib/backends/redis/redis.backend.js';
import { LockHealthIndicator } from '../lib/lock.health-indicator.js';
import { LockService } from '../lib/lock.service.js';
import { useRedisServer } from './support/redis-fixture.js';

// A Redis master that answers every read while it refuses writes (here: it must confirm each write
// on a replica it does not have, `min-replicas-to-write`): the health check must say down, as every
// lock fails there, though the server is a master and answers at once.
describe('LockHealthIndicator on a Redis master that refuses writes', () => {
  const fixture = useRedisServer();

  it('is up while it takes writes, and down once it refuses them', async () => {
    const locks = new LockService(new RedisLockBackend(fixture.server.url));
    fixture.cleanup(() => locks.onApplicationShutdown());
    fixture.cleanup(() => fixture.admin.config('SET', 'min-replicas-to-write', '0'));
    const indicator = new LockHealthIndicator(locks);
    expect(await indicator.isHealthy('locks', { timeout: 5_000 })).toMatchObject({ locks: { status: 'up', role: 'master' } });

    await fixture.admin.config('SET', 'min-replicas-to-write', '1');
    // Reads (the lock's inspect script, INFO) are still answered: only the lock's writes are refused.
    expect(await locks.inspect('order:1')).toBeUndefined();
    await expect(locks.tryAcquire('order:1')).rejects.toThrow();
    expect(await indicator.isHealthy('locks', { timeout: 5_000 })).toMatchObject({ locks: { status: 'down', backend: 'redis' } });
  });
});
