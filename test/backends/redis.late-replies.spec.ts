import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { LockService, RedisLockBackend, type LockHandle } from '../../lib/index.js';
import { RedisServer } from '../support/redis-server.js';
import { until } from '../support/wait.js';

/**
 * Answers that come after the caller stopped waiting for them: a Redis that stalls longer than
 * `commandTimeout` still runs every request queued on the connection once it goes on.
 */
describe('Redis backend: late answers', () => {
  let server: RedisServer;
  let admin: Redis;
  const cleanup: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    server = await RedisServer.start();
    admin = new Redis(server.port, '127.0.0.1');
  });
  afterEach(async () => {
    server.resume();
    while (cleanup.length) await cleanup.pop()!().catch(() => undefined);
    await admin.flushall();
  });
  afterAll(async () => {
    admin.disconnect();
    await server.stop();
  });

  function service(options: { commandTimeout?: number; pollInterval?: number } = {}): LockService {
    const backend = new RedisLockBackend(server.url, { commandTimeout: options.commandTimeout ?? 2_000 });
    const locks = new LockService(backend, { pollInterval: options.pollInterval ?? 100, keyPrefix: '' });
    cleanup.push(() => locks.onApplicationShutdown());
    return locks;
  }

  it('a late answer to a timed-out acquire never frees the lock a later attempt of the same caller won', async () => {
    const first = service({ commandTimeout: 300, pollInterval: 100 });
    const second = service();
    await first.isLocked('late:k'); // connected before the stall

    // Redis stalls 1.5 s: the caller's attempts time out one after the other but stay queued on
    // its connection, and all of them run once Redis goes on.
    server.pause();
    const acquiring = first.acquire('late:k', { wait: 10_000, ttl: 30_000 });
    await new Promise((resolve) => setTimeout(resolve, 1_500)); // the stall itself, not synchronisation
    server.resume();
    const handle: LockHandle = await acquiring;
    cleanup.push(() => handle.release());

    // Anything the late answers set off was sent before the winning answer came in; a request of
    // the same connection sent now runs after it.
    await first.inspect('late:k');
    expect(await admin.get('late:k')).toBe(handle.leases[0].owner);
    expect(handle.isHeld).toBe(true);
    expect(await second.tryAcquire('late:k')).toBeUndefined();
  });

  it('a late answer to an acquire that gave up frees the lock it won', async () => {
    const first = service({ commandTimeout: 300 });
    await first.isLocked('late:gave-up');
    server.pause();
    // One attempt, no waiting: it fails on the timeout while its request still sits in Redis.
    await expect(first.tryAcquire('late:gave-up')).rejects.toThrow(/did not answer/);
    server.resume();
    await until(async () => (await admin.exists('late:gave-up')) === 0, 5_000, 'the late lock to be freed');
  });
});
