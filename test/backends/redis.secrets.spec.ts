import { describe, expect, it } from '@jest/globals';
import { inspect } from 'node:util';
import { LockBackendError, LockLostError, LockService, RedisLockBackend, RedlockLockBackend } from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';

const fixture = useRedisServer();

/** Everything an operator's logs or an error response could show of an error. */
function shown(error: unknown): string {
  return `${inspect(error, { depth: 10, showHidden: true })}\n${JSON.stringify(error)}\n${String(error)}`;
}

describe('errors and logs keep secrets out', () => {
  it('an error from a failed script does not carry the owner token it was sent with', async () => {
    const backend = new RedisLockBackend(fixture.server.url);
    const owners: string[] = [];
    const tryAcquire = backend.tryAcquire.bind(backend);
    backend.tryAcquire = (keys, owner, ...rest) => (owners.push(owner), tryAcquire(keys, owner, ...rest));
    const locks = new LockService(backend, { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    // Another program's hash where the lock would go: the acquire script fails on it.
    await fixture.admin.hset('taken-by-a-hash', 'field', '1');
    const error = await locks.acquire('taken-by-a-hash', { wait: 0 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect(shown(error)).toMatch(/WRONGTYPE/);
    // Whoever has an owner token can release or extend the lock as its holder.
    expect(owners).toHaveLength(1);
    expect(shown(error)).not.toContain(owners[0]);
  });

  it('an error of a lease lost to the backend does not carry it either', async () => {
    const locks = new LockService(new RedisLockBackend(fixture.server.url), { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const handle = await locks.acquire('turned-into-a-hash', { ttl: 60_000 });
    await fixture.admin.del('turned-into-a-hash');
    await fixture.admin.hset('turned-into-a-hash', 'field', '1');
    const error = await handle.extend().catch((e: unknown) => e);
    expect(error instanceof LockBackendError || error instanceof LockLostError).toBe(true);
    expect(shown(error)).not.toContain(handle.leases[0].owner);
  });

  it('a backend shown in a log (util.inspect, JSON.stringify) shows no password of its connection, nor owner tokens', async () => {
    const url = `redis://default:s3cret-pw@127.0.0.1:${fixture.server.port}/0`;
    const redis = new RedisLockBackend(url);
    // Three masters nobody listens on: shown, not used.
    const redlock = new RedlockLockBackend([
      'redis://default:s3cret-pw@127.0.0.1:1',
      'redis://127.0.0.1:2?password=s3cret-pw',
      'redis://:s3cret-pw@127.0.0.1:3',
    ]);
    const locks = new LockService(redis);
    fixture.cleanup(() => redlock.close());
    fixture.cleanup(() => locks.onApplicationShutdown());
    const handle = await locks.acquire('shown');
    for (const backend of [redis, redlock]) {
      const text = `${inspect(backend, { depth: 10, showHidden: true })}\n${JSON.stringify(backend)}`;
      expect(text).not.toContain('s3cret-pw');
      expect(text).not.toContain(handle.leases[0].owner);
    }
    expect(inspect(redis)).toMatch(/RedisLockBackend \{ name: 'redis'/);
    expect(JSON.parse(JSON.stringify(redlock))).toEqual({ name: 'redlock', masters: 3, quorum: 2 });
  });
});
