import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { InvalidLockOptionsError, LockBackendError, LockHealthIndicator, LockService, RedisLockBackend } from '../../lib/index.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { freePort, RedisServer } from '../support/redis-server.js';
import { until } from '../support/wait.js';

/**
 * What a Redis server refuses for good (no such database, credentials, rights, a replica) fails at
 * once, as a permanent LockBackendError that says what to fix, at the first lock and in verify();
 * never in another database, never echoing a password.
 */
const fixture = useRedisServer();
const PASSWORD = 'pw-correct-horse-4821';
const WRONG = 'pw-wrong-battery-7350';

let guarded: RedisServer;
let replica: RedisServer;
beforeAll(async () => {
  [guarded, replica] = await Promise.all([RedisServer.start(), RedisServer.start()]);
  const admin = new Redis(replica.port, '127.0.0.1');
  await admin.call('REPLICAOF', '127.0.0.1', String(fixture.server.port));
  admin.disconnect();
  // Set once it answered the harness's PING, which a password would refuse.
  const guard = new Redis(guarded.port, '127.0.0.1');
  await guard.config('SET', 'requirepass', PASSWORD);
  guard.disconnect();
}, 30_000);
afterAll(() => Promise.all([guarded?.stop(), replica?.stop()]));

const closing: (() => unknown)[] = [];
afterEach(async () => {
  for (const close of closing.splice(0).reverse()) await close();
});

let logged: string[] = [];
beforeAll(() => {
  for (const level of ['error', 'warn', 'log'] as const) {
    jest.spyOn(Logger.prototype, level).mockImplementation((message: unknown) => void logged.push(String(message)));
  }
});
afterAll(() => {
  jest.restoreAllMocks();
});
afterEach(() => {
  // No password in anything a log showed.
  expect(logged.join('\n')).not.toMatch(new RegExp(`${PASSWORD}|${WRONG}`));
  logged = [];
});

function serviceOf(backend: RedisLockBackend): LockService {
  const service = new LockService(backend, { keyPrefix: '' });
  closing.push(() => service.onApplicationShutdown());
  return service;
}

/** The acquire's error; a wait that the test's own timeout outlasts, so a retried refusal fails it. */
async function refusedAcquire(backend: RedisLockBackend): Promise<LockBackendError> {
  const error = await serviceOf(backend)
    .acquire('k', { wait: 120_000 })
    .then(
      () => undefined,
      (e: unknown) => e,
    );
  expect(error).toBeInstanceOf(LockBackendError);
  expect((error as LockBackendError).permanent).toBe(true);
  expect((error as Error).message).not.toMatch(new RegExp(`${PASSWORD}|${WRONG}`));
  return error as LockBackendError;
}

describe('a database the server does not have', () => {
  it('fails the first lock at once, naming the database and the limit, and locks nothing in database 0', async () => {
    const error = await refusedAcquire(new RedisLockBackend(`${fixture.server.url}/99`));
    expect(error.message).toMatch(/Redis at 127\.0\.0\.1:\d+ has no database 99/);
    expect(error.message).toMatch(/redis:\/\/host:6379\/0/);
    expect(await fixture.admin.dbsize()).toBe(0);
    expect(logged.join('\n')).not.toMatch(/Reconnecting; lock operations fail until it is back/);
  }, 30_000);

  it('is refused by verify(), with the server’s limit, for a URL and for a client of the user’s', async () => {
    const fromUrl = new RedisLockBackend(`${fixture.server.url}/99`);
    closing.push(() => fromUrl.close());
    await expect(fromUrl.verify()).rejects.toMatchObject({ permanent: true, message: expect.stringMatching(/has no database 99: .*16/) });

    const yours = new Redis(`${fixture.server.url}/99`);
    yours.on('error', () => undefined);
    closing.push(() => yours.disconnect());
    const backend = new RedisLockBackend(yours);
    await expect(backend.verify()).rejects.toMatchObject({
      permanent: true,
      message: expect.stringMatching(/has no database 99: it has 16 \(0 to 15\)/),
    });
  });

  it.each([
    ['the ready check off', {}],
    ['the ready check off and no client info', { disableClientInfo: true }],
  ])(
    'with %s, fails clearly and sends nothing to database 0',
    async (_, more) => {
      // A user that may not read CONFIG: the server's limit stays unknown.
      await fixture.admin.call('ACL', 'SETUSER', 'noconfig', 'reset', 'on', `>${PASSWORD}`, '~*', '&*', '+@all', '-config');
      closing.push(() => fixture.admin.call('ACL', 'DELUSER', 'noconfig'));
      const unhandled: unknown[] = [];
      const onUnhandled = (reason: unknown) => void unhandled.push(reason);
      process.on('unhandledRejection', onUnhandled);
      closing.push(() => process.off('unhandledRejection', onUnhandled));
      const backend = new RedisLockBackend({
        host: '127.0.0.1',
        port: fixture.server.port,
        db: 99,
        username: 'noconfig',
        password: PASSWORD,
        enableReadyCheck: false,
        ...more,
      });
      const error = await refusedAcquire(backend);
      expect(error.message).toMatch(/has no database 99/);
      // The look-up of the limit ends with a log of the refusal, whatever it found.
      await until(() => logged.some((line) => /has no database 99/.test(line)), 20_000, 'the refusal logged');
      expect(unhandled).toEqual([]);
      expect(await fixture.admin.dbsize()).toBe(0);
      await expect(backend.verify()).rejects.toMatchObject({ permanent: true, message: expect.stringMatching(/has no database 99/) });
    },
    30_000,
  );

  it('verify() resolves for a database the server has', async () => {
    const backend = new RedisLockBackend(`${fixture.server.url}/3`);
    closing.push(() => backend.close());
    await expect(backend.verify()).resolves.toBeUndefined();
  });
});

describe('a URL without a scheme', () => {
  it('is refused with what was written and how to write it, without the password', () => {
    expect(() => new RedisLockBackend('localhost:6379')).toThrow(InvalidLockOptionsError);
    expect(() => new RedisLockBackend('localhost:6379')).toThrow(
      /'localhost:6379' has no scheme: write it as 'redis:\/\/localhost:6379' \('rediss:\/\/' for TLS\)/,
    );
    const error = (() => {
      try {
        new RedisLockBackend(`locks:${PASSWORD}@localhost:6379`);
      } catch (e) {
        return e as Error;
      }
    })();
    expect(error?.message).toContain("'locks:***@localhost:6379' has no scheme");
    expect(error?.message).not.toContain(PASSWORD);
  });
});

describe('credentials refused', () => {
  it('a wrong password (WRONGPASS) fails the first lock at once and verify(), without echoing it', async () => {
    const url = `redis://:${WRONG}@127.0.0.1:${guarded.port}`;
    const error = await refusedAcquire(new RedisLockBackend(url));
    expect(error.message).toMatch(/Redis at 127\.0\.0\.1:\d+ refused the credentials/);
    const backend = new RedisLockBackend(url);
    closing.push(() => backend.close());
    await expect(backend.verify()).rejects.toMatchObject({ permanent: true, message: expect.stringMatching(/refused the credentials/) });
  }, 30_000);

  it('no password where one is required (NOAUTH) fails the first lock at once', async () => {
    const error = await refusedAcquire(new RedisLockBackend(`redis://127.0.0.1:${guarded.port}`));
    expect(error.message).toMatch(/refused the credentials \(or asked for some and got none\)/);
  }, 30_000);

  it('the right password locks', async () => {
    const handle = await serviceOf(new RedisLockBackend(`redis://:${PASSWORD}@127.0.0.1:${guarded.port}`)).acquire('k');
    await handle.release();
  });
});

describe('rights and roles', () => {
  it('a user whose ACL refuses the lock scripts (NOPERM) fails at once, with the rule to grant', async () => {
    await fixture.admin.call('ACL', 'SETUSER', 'reader', 'reset', 'on', `>${PASSWORD}`, '~*', '+ping', '+info', '+get');
    closing.push(() => fixture.admin.call('ACL', 'DELUSER', 'reader'));
    const error = await refusedAcquire(new RedisLockBackend(`redis://reader:${PASSWORD}@127.0.0.1:${fixture.server.port}`));
    expect(error.message).toMatch(/ACL refused it/);
  }, 30_000);

  it('a replica (READONLY) fails the first lock at once, and verify() says to use the master', async () => {
    const error = await refusedAcquire(new RedisLockBackend(replica.url));
    expect(error.message).toMatch(/READONLY.*is a read-only replica/);
    const backend = new RedisLockBackend(replica.url);
    closing.push(() => backend.close());
    await expect(backend.verify()).rejects.toMatchObject({ permanent: true, message: expect.stringMatching(/is a replica: .*master/) });
  }, 30_000);
});

describe('a server that cannot be reached', () => {
  it('verify() resolves (operations fail until it is back), and health says so in words about the server', async () => {
    const port = await freePort();
    const backend = new RedisLockBackend(`redis://:${PASSWORD}@127.0.0.1:${port}`, { commandTimeout: 500 });
    closing.push(() => backend.close());
    await expect(backend.verify()).resolves.toBeUndefined();
    const indicator = new LockHealthIndicator(serviceOf(backend));
    const health = await indicator.isHealthy('locks', { timeout: 10_000 });
    expect(health.locks).toMatchObject({ status: 'down' });
    const message = String(health.locks.message);
    expect(message).toContain(`Redis at 127.0.0.1:${port} refused the connection (is it running, on this host and port?).`);
    expect(message).not.toMatch(/maxRetriesPerRequest|max retries/);
  });
});
