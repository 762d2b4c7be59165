import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { LockBackendError, LockService, RedisLockBackend } from '../../lib/index.js';
import { RedisServer } from '../support/redis-server.js';
import { until } from '../support/wait.js';

/**
 * Managed Redis behind one name for the master (a primary endpoint, a Kubernetes Service): a
 * failover demotes the server a backend's connection is on, which then answers READONLY, and
 * Redis does not close the connection. That heals; only a backend pointed at a replica fails at once.
 */
let server: RedisServer;
let other: RedisServer;
let admin: Redis;
beforeAll(async () => {
  [server, other] = await Promise.all([RedisServer.start(), RedisServer.start()]);
  admin = new Redis(server.port, '127.0.0.1');
}, 30_000);
afterAll(async () => {
  admin?.disconnect();
  await Promise.all([server?.stop(), other?.stop()]);
});

const closing: (() => unknown)[] = [];
afterEach(async () => {
  for (const close of closing.splice(0).reverse()) await close();
  await admin.call('REPLICAOF', 'NO', 'ONE');
});

/** How many READONLY answers the server gave so far (Redis 6.2's error statistics). */
async function readOnlyAnswers(): Promise<number> {
  const stats = await admin.info('errorstats');
  return Number(/errorstat_READONLY:count=(\d+)/.exec(stats)?.[1] ?? 0);
}

describe('a master demoted under the backend', () => {
  it('and promoted again within the wait: the waiting lock is granted, not failed for good', async () => {
    const locks = new LockService(new RedisLockBackend(server.url), { keyPrefix: '' });
    closing.push(() => locks.onApplicationShutdown());
    await (await locks.acquire('before')).release();

    await admin.call('REPLICAOF', '127.0.0.1', String(other.port));
    const before = await readOnlyAnswers();
    const acquiring = locks.acquire('during', { wait: 60_000 }).then(
      (handle) => handle,
      (error: unknown) => error,
    );
    await until(async () => (await readOnlyAnswers()) > before, 20_000, 'the demoted server answered READONLY');
    await admin.call('REPLICAOF', 'NO', 'ONE');

    const outcome = await acquiring;
    expect(outcome).not.toBeInstanceOf(LockBackendError);
    await (outcome as { release(): Promise<void> }).release();
  }, 60_000);

  it('verify() passes once the server is a master again, and refuses a server that stays a replica', async () => {
    const backend = new RedisLockBackend(server.url);
    closing.push(() => backend.close());
    await expect(backend.verify()).resolves.toBeUndefined();
    await admin.call('REPLICAOF', '127.0.0.1', String(other.port));
    await expect(backend.verify()).rejects.toMatchObject({ permanent: true, message: expect.stringMatching(/is a replica: .*master/) });
  }, 30_000);
});
