import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { RedlockLockBackend } from '../../../lib/backends/redlock/redlock.backend.js';
import { InvalidLockOptionsError, LockBackendError } from '../../../lib/lock.errors.js';
import { LockHealthIndicator } from '../../../lib/lock.health-indicator.js';
import { LockService } from '../../../lib/lock.service.js';
import { freePort, RedisServer } from '../../support/redis-server.js';
import { RedlockMasters } from './redlock-masters.js';

const PASSWORD = 'pw-guarded-masters-6612';

/**
 * Masters that refuse this client for good (credentials, no such database), masters that are not
 * distinct masters, and URLs written without a scheme: refused at start-up by verify() and, when a
 * quorum cannot be reached because of them, at the first lock at once rather than after the wait.
 */
describe('redlock backend: refusals that waiting cannot heal', () => {
  let masters: RedlockMasters;
  let replica: RedisServer;
  const closing: (() => unknown)[] = [];

  beforeAll(async () => {
    masters = await RedlockMasters.start(3);
    replica = await RedisServer.start({ args: ['--replicaof', '127.0.0.1', String(masters.servers[2].port)] });
    jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  }, 30_000);

  afterEach(async () => {
    for (const close of closing.splice(0).reverse()) await close();
    masters.disconnect();
    await masters.flush();
  });

  afterAll(async () => {
    jest.restoreAllMocks();
    await replica.stop();
    await masters.stop();
  });

  const backend = (clients: (Redis | string)[]) => {
    const created = new RedlockLockBackend({ clients, masterTimeout: 2_000 });
    closing.push(() => created.close());
    return created;
  };
  const urls = () => masters.servers.map((server) => server.url);

  it('refuses a URL without a scheme with what was written and how to write it, without its password', () => {
    const [, b, c] = urls();
    expect(() => backend(['localhost:6379', b, c])).toThrow(InvalidLockOptionsError);
    expect(() => backend(['localhost:6379', b, c])).toThrow(
      /clients\[0\] is 'localhost:6379', which has no scheme: write it as 'redis:\/\/localhost:6379'/,
    );
    expect(() => backend([`:${PASSWORD}@localhost:6379`, b, c])).toThrow(/':\*\*\*@localhost:6379', which has no scheme/);
    expect(() => backend([`:${PASSWORD}@localhost:6379`, b, c])).not.toThrow(new RegExp(PASSWORD));
  });

  it('verify() refuses one server under two names, with the message of the first lock', async () => {
    const [a, b] = masters.connect();
    const alias = new Redis({ port: masters.servers[0].port, host: 'localhost', family: 4 });
    closing.push(() => alias.disconnect());
    const verified = await backend([a, b, alias])
      .verify()
      .catch((e: unknown) => e);
    expect(verified).toBeInstanceOf(LockBackendError);
    expect((verified as LockBackendError).permanent).toBe(true);
    expect((verified as Error).message).toMatch(/are the same redis-server \(run_id \w+\)/);

    const atFirstLock = await new LockService(backend([a, b, alias]), { keyPrefix: '' }).tryAcquire('job').catch((e: unknown) => e);
    // The same words (the two names come in the order the servers answered).
    const same = /are the same redis-server \(run_id \w+\): one server would vote twice, .* List each server once\./;
    expect((atFirstLock as Error).message).toMatch(same);
    expect((verified as Error).message).toMatch(same);
  });

  it('verify() refuses a replica listed as a master', async () => {
    const [a, b] = masters.connect();
    await expect(backend([a, b, masters.client(replica)]).verify()).rejects.toMatchObject({
      permanent: true,
      message: expect.stringMatching(/is a replica \(of 127\.0\.0\.1:\d+\)/),
    });
  });

  it('verify() resolves for distinct masters, and when masters cannot be reached', async () => {
    await expect(backend(masters.connect()).verify()).resolves.toBeUndefined();
    const down = `redis://127.0.0.1:${await freePort()}`;
    const [a, b] = urls();
    await expect(backend([a, b, down]).verify()).resolves.toBeUndefined();
    await expect(backend([a, down, `redis://127.0.0.1:${await freePort()}`]).verify()).resolves.toBeUndefined();
  });

  describe('masters that refuse this client for good', () => {
    // Set for each test, and unset before the masters are emptied after it.
    beforeEach(async () => {
      for (const server of masters.servers.slice(0, 2)) {
        const admin = new Redis(server.port, '127.0.0.1');
        await admin.config('SET', 'requirepass', PASSWORD);
        admin.disconnect();
        closing.unshift(async () => {
          const guarded = new Redis(server.port, '127.0.0.1', { password: PASSWORD });
          await guarded.config('SET', 'requirepass', '');
          guarded.disconnect();
        });
      }
    });

    it('credentials refused by two of three: the first lock fails at once, verify() too, and neither shows the password', async () => {
      const wrong = urls().map((url) => url.replace('redis://', `redis://:not-${PASSWORD}@`));
      const locks = new LockService(backend(wrong), { keyPrefix: '' });
      // A wait the test's own timeout outlasts: a refusal retried for the whole wait fails the test.
      const error = await locks.acquire('job', { wait: 120_000 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LockBackendError);
      expect((error as LockBackendError).permanent).toBe(true);
      expect((error as Error).message).toMatch(/WRONGPASS.*refused the credentials/);
      expect((error as Error).message).not.toContain(PASSWORD);

      const verified = await backend(wrong)
        .verify()
        .catch((e: unknown) => e);
      expect((verified as LockBackendError).permanent).toBe(true);
      expect((verified as Error).message).toMatch(/no quorum for verify: 1 of 3 masters answered, 2 needed.*WRONGPASS/);
      expect((verified as Error).message).not.toContain(PASSWORD);
    }, 30_000);

    it('refused by one of three only: a quorum is left, and it locks', async () => {
      const [a, b, c] = urls();
      const locks = new LockService(backend([a.replace('redis://', `redis://:${PASSWORD}@`), b, c]), { keyPrefix: '' });
      await expect(backend([a.replace('redis://', `redis://:${PASSWORD}@`), b, c]).verify()).resolves.toBeUndefined();
      const handle = await locks.acquire('job', { wait: 10_000 });
      await handle.release();
    }, 30_000);
  });

  it('a database two masters do not have: the first lock fails at once, and nothing is locked in database 0', async () => {
    const [a, b, c] = urls();
    const locks = new LockService(backend([`${a}/99`, `${b}/99`, c]), { keyPrefix: '' });
    const error = await locks.acquire('job', { wait: 120_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as LockBackendError).permanent).toBe(true);
    expect((error as Error).message).toMatch(/it has no database 99/);
    expect(await masters.keyCounts()).toEqual([0, 0, 0]);
  }, 30_000);

  it('health names the masters that cannot be reached in words about them, not ioredis’s', async () => {
    const [a] = urls();
    const ports = [await freePort(), await freePort()];
    const locks = new LockService(backend([a, ...ports.map((port) => `redis://127.0.0.1:${port}`)]), { keyPrefix: '' });
    closing.push(() => locks.onApplicationShutdown());
    const health = await new LockHealthIndicator(locks).isHealthy('locks', { timeout: 10_000 });
    expect(health.locks.status).toBe('down');
    expect(health.locks.message).toContain(`master 127.0.0.1:${ports[0]}: refused the connection (is it running, on this host and port?)`);
    expect(String(health.locks.message)).not.toMatch(/maxRetriesPerRequest|max retries/);
  });
});
