import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { InvalidLockOptionsError } from '../../../lib/lock.errors.js';
import { LockService } from '../../../lib/lock.service.js';
import { RedisServer } from '../../support/redis-server.js';
import { RedlockMasters } from './redlock-masters.js';

/**
 * Masters are told apart by what the servers say they are, not by their addresses: one server
 * reached under two names, a replica and a Cluster node are refused at the first operation.
 */
describe('redlock backend: what the masters are', () => {
  let masters: RedlockMasters;
  let replica: RedisServer;
  let clusterNode: RedisServer;
  const backends: RedlockLockBackend[] = [];

  beforeAll(async () => {
    masters = await RedlockMasters.start(3);
    [replica, clusterNode] = await Promise.all([
      RedisServer.start({ args: ['--replicaof', '127.0.0.1', String(masters.servers[2].port)] }),
      RedisServer.start({ args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf'] }),
    ]);
  }, 30_000);

  afterEach(async () => {
    jest.restoreAllMocks();
    await Promise.all(backends.splice(0).map((backend) => backend.close()));
    masters.disconnect();
    await masters.flush();
  });

  afterAll(async () => {
    await Promise.all([replica.stop(), clusterNode.stop()]);
    await masters.stop();
  });

  const backend = (clients: Redis[]) => {
    const created = new RedlockLockBackend({ clients, masterTimeout: 2_000 });
    backends.push(created);
    return created;
  };
  const refused = async (clients: Redis[], message: RegExp) => {
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    const locks = new LockService(backend(clients), { keyPrefix: '' });
    const failure = await locks.tryAcquire('job').catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(InvalidLockOptionsError);
    expect((failure as InvalidLockOptionsError).option).toBe('clients');
    expect((failure as Error).message).toMatch(message);
    expect(error).toHaveBeenCalledWith(expect.stringMatching(message));
    // Every operation keeps refusing, and nothing was written.
    await expect(locks.isLocked('job')).rejects.toBeInstanceOf(InvalidLockOptionsError);
    expect(await masters.keyCounts()).toEqual([0, 0, 0]);
  };

  it('refuses one redis-server reached under two names: it would vote twice', async () => {
    const [a, b] = masters.connect();
    const alias = new Redis({ port: masters.servers[0].port, host: 'localhost', family: 4 });
    try {
      await refused(
        [a, b, alias],
        /masters 127\.0\.0\.1:\d+ and localhost:\d+ are the same redis-server \(run_id \w+\): one server would vote twice/,
      );
    } finally {
      alias.disconnect();
    }
  });

  it('refuses a replica listed as a master, naming its master', async () => {
    const [a, b] = masters.connect();
    const port = masters.servers[2].port;
    await refused(
      [a, b, masters.client(replica)],
      new RegExp(`master 127\\.0\\.0\\.1:${replica.port} is a replica \\(of 127\\.0\\.0\\.1:${port}\\)`),
    );
  });

  it('refuses a Redis Cluster node and says what to use instead', async () => {
    const [a, b] = masters.connect();
    await refused(
      [a, b, masters.client(clusterNode)],
      /is a node of a Redis Cluster.*Use independent standalone masters, or the Redis backend/,
    );
  });

  it('accepts three distinct standalone masters', async () => {
    const locks = new LockService(backend(masters.connect()), { keyPrefix: '' });
    const handle = await locks.tryAcquire('job');
    expect(handle?.isHeld).toBe(true);
    await handle!.release();
  });
});
