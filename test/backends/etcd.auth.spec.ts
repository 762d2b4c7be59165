import { beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Etcd3 } from 'etcd3';
import { inspect } from 'node:util';
import { EtcdLockBackend, LockBackendError, LockHealthIndicator, LockService } from '../../lib/index.js';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { freePort } from '../support/redis-server.js';

/**
 * An etcd with authentication on, as operators run a shared cluster: a user per application, with
 * a role that grants it the lock prefix. Credentials or rights that etcd refuses cannot heal by
 * waiting: they fail at once, say what to change, and never show the password.
 */
// Keys stay: the fixture's admin client has no user to delete them with.
const fixture = useEtcdCluster({ members: 1, wipe: false });

const PREFIX = 'nest-distributed-lock/';
const WRONG = 'not-the-password-7f3a';

beforeAll(async () => {
  await fixture.cluster.enableAuth('root-pw-51c2', [
    { name: 'locks', password: 'locks-pw-9d0e', prefix: PREFIX, permission: 'readwrite' },
    { name: 'reader', password: 'reader-pw-2b7c', prefix: PREFIX, permission: 'read' },
    { name: 'other-app', password: 'other-pw-6e1d', prefix: 'other-app/', permission: 'readwrite' },
  ]);
}, 60_000);

function backend(username: string, password: string, hosts: string[] = fixture.endpoints): EtcdLockBackend {
  const created = new EtcdLockBackend({ hosts, auth: { username, password } });
  fixture.cleanup(() => created.close());
  return created;
}

function service(lockBackend: EtcdLockBackend): LockService {
  const locks = new LockService(lockBackend, { keyPrefix: 'auth:' });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

function quietLogs(): void {
  const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  fixture.cleanup(() => {
    warn.mockRestore();
    error.mockRestore();
  });
}

/** Everything a log could show of an error: its message, its causes, its properties. */
function shown(error: unknown): string {
  return `${String(error)}\n${inspect(error, { depth: 10, showHidden: true })}\n${JSON.stringify(error)}`;
}

// Each acquire waits far longer than its test may run: a refusal retried for the wait times it out.
const LONG_WAIT = 10 * 60_000;

describe('etcd backend with authentication on', () => {
  it('the user granted the lock prefix locks, waits and releases', async () => {
    const [a, b] = [service(backend('locks', 'locks-pw-9d0e')), service(backend('locks', 'locks-pw-9d0e'))];
    const held = await a.acquire('k');
    const waiting = b.acquire('k', { wait: 10_000 });
    await held.release();
    const next = await waiting;
    expect(next.fencingToken).toBeGreaterThan(held.fencingToken!);
    await next.release();
  });

  it('a wrong password fails an acquire at once, as permanent, naming the user and what to check, never the password', async () => {
    quietLogs();
    const error = await service(backend('locks', WRONG))
      .acquire('k', { wait: LONG_WAIT })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect(error).toMatchObject({ permanent: true });
    expect((error as Error).message).toMatch(
      /etcd refused the credentials of user 'locks' \(authentication failed.*auth: \{ username, password \}/,
    );
    expect(shown(error)).not.toContain(WRONG);
  }, 30_000);

  it.each([
    ['read only', 'reader', 'reader-pw-2b7c'],
    ['on another prefix only', 'other-app', 'other-pw-6e1d'],
  ])(
    'a user with rights %s (%s) fails an acquire at once: permission denied, naming the prefix to grant',
    async (_rights, name, password) => {
      quietLogs();
      const error = await service(backend(name, password))
        .acquire('k', { wait: LONG_WAIT })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LockBackendError);
      expect(error).toMatchObject({ permanent: true });
      expect((error as Error).message).toContain(`etcd refused user '${name}' this operation (permission denied)`);
      expect((error as Error).message).toContain(`etcdctl role grant-permission locks readwrite --prefix=true '${PREFIX}'`);
      expect(shown(error)).not.toContain(password);
    },
    30_000,
  );

  describe('verify()', () => {
    it('resolves for the user granted the lock prefix', async () => {
      await expect(backend('locks', 'locks-pw-9d0e').verify()).resolves.toBeUndefined();
    });

    it('rejects a wrong password, as permanent', async () => {
      const error = await backend('locks', WRONG)
        .verify()
        .catch((e: unknown) => e);
      expect(error).toMatchObject({ name: 'LockBackendError', permanent: true });
      expect((error as Error).message).toMatch(/authentication failed/);
      expect(shown(error)).not.toContain(WRONG);
    });

    it.each([
      ['reader', 'reader-pw-2b7c'],
      ['other-app', 'other-pw-6e1d'],
    ])('rejects user %s, who may not write the lock prefix, as permanent', async (name, password) => {
      const error = await backend(name, password)
        .verify()
        .catch((e: unknown) => e);
      expect(error).toMatchObject({ name: 'LockBackendError', permanent: true });
      expect((error as Error).message).toMatch(/verify failed: etcd refused user .* \(permission denied\)/);
    });

    it('writes nothing when it passes', async () => {
      const locks = backend('locks', 'locks-pw-9d0e');
      await locks.verify();
      // Read with the lock user's own rights: the probe key was never put.
      const raw = new Etcd3({ hosts: fixture.endpoints, auth: { username: 'locks', password: 'locks-pw-9d0e' } });
      fixture.cleanup(() => raw.close());
      expect((await raw.getAll().prefix(PREFIX).keys()).filter((key) => key.includes('probe'))).toEqual([]);
    });

    it('resolves when no member can be reached: lock operations fail until one can', async () => {
      const unreachable = new EtcdLockBackend(
        { hosts: [`http://127.0.0.1:${await freePort()}`], auth: { username: 'locks', password: 'locks-pw-9d0e' } },
        { commandTimeout: 500 },
      );
      fixture.cleanup(() => unreachable.close());
      await expect(unreachable.verify()).resolves.toBeUndefined();
    });
  });

  it('the health check of a user who may read but not write the lock prefix is down, with the fix', async () => {
    const health = new LockHealthIndicator(service(backend('reader', 'reader-pw-2b7c')));
    const result = await health.isHealthy('locks', { timeout: 5_000 });
    expect(result.locks.status).toBe('down');
    expect(result.locks.message).toMatch(/permission denied.*grant-permission locks readwrite --prefix=true 'nest-distributed-lock\/'/);
    const fine = await new LockHealthIndicator(service(backend('locks', 'locks-pw-9d0e'))).isHealthy('locks', { timeout: 5_000 });
    expect(fine.locks.status).toBe('up');
  });
});
