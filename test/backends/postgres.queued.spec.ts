import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { LockBackendError, LockService, PostgresLockBackend } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { until } from '../support/wait.js';

/**
 * Statements PostgreSQL carried out whose answers were lost with their connection: pg fails them
 * and never hears how they went. What they won must not stay held by nobody until its ttl.
 */
describe('PostgreSQL backend: statements applied, answers lost with the connection', () => {
  const fixture = usePostgresServer();

  async function throughProxy(): Promise<{ proxy: TcpProxy; backend: PostgresLockBackend; locks: LockService }> {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const proxy = await TcpProxy.start(fixture.server.port);
    fixture.cleanup(() => proxy.close());
    const url = new URL(fixture.url);
    url.port = String(proxy.port);
    const backend = new PostgresLockBackend(url.toString(), { commandTimeout: 300 });
    const locks = new LockService(backend, { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown().catch(() => undefined));
    await (await locks.acquire('queued:warm-up')).release(); // the tables exist after it
    return { proxy, backend, locks };
  }

  async function rowOf(key: string): Promise<boolean> {
    const { rowCount } = await fixture.admin.query('SELECT 1 FROM distributed_locks WHERE key = $1 AND expires_at > clock_timestamp()', [
      key,
    ]);
    return rowCount === 1;
  }

  it('a tryAcquire whose answer was lost: the lock it won is freed once PostgreSQL is reachable again', async () => {
    const { proxy, backend, locks } = await throughProxy();
    const releases: Promise<unknown>[] = [];
    const release = backend.release.bind(backend);
    jest.spyOn(backend, 'release').mockImplementation((keys, owner) => {
      const sent = release(keys, owner);
      releases.push(sent.catch(() => undefined));
      return sent;
    });
    proxy.set({ kind: 'blackhole-down' }); // carried out, unanswered
    const trying = locks.tryAcquire('queued:pg', { ttl: 60_000 });
    await until(() => rowOf('queued:pg'), 5_000, 'the attempt to be carried out');
    proxy.set({ kind: 'drop' });
    await expect(trying).rejects.toThrow(LockBackendError);
    await Promise.all(releases); // what the caller sent on giving up failed with the connection
    expect(await rowOf('queued:pg')).toBe(true);
    proxy.set({ kind: 'pass' });
    await locks.isLocked('queued:other'); // the application goes on using its locks
    await until(async () => !(await rowOf('queued:pg')), 10_000, 'the lock nobody holds to be freed');
  });

  it('a holder whose release failed while PostgreSQL was unreachable: the lock is freed once it is back, not at the end of its ttl', async () => {
    const { proxy, locks } = await throughProxy();
    const handle = await locks.acquire('queued:pg-held', { ttl: 60_000, autoExtend: false });
    proxy.set({ kind: 'drop' });
    await expect(handle.release()).rejects.toThrow(LockBackendError);
    proxy.set({ kind: 'pass' });
    await locks.isLocked('queued:other');
    await until(async () => !(await rowOf('queued:pg-held')), 10_000, 'the released lock to be freed');
  });
});
