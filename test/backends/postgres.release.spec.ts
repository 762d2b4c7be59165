import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { LockBackendError, PostgresLockBackend } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { until } from '../support/wait.js';

const fixture = usePostgresServer();

describe('PostgreSQL backend: a release that does not reach PostgreSQL', () => {
  it('fails rather than reporting success, and is sent again once PostgreSQL answers: the key is freed', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => jest.restoreAllMocks());
    const proxy = await TcpProxy.start(fixture.server.port);
    fixture.cleanup(() => proxy.close());
    const url = new URL(fixture.url);
    url.port = String(proxy.port);
    const backend = new PostgresLockBackend(url.toString(), { commandTimeout: 1_000 });
    fixture.cleanup(() => backend.close());
    const held = async () =>
      (await fixture.admin.query(`SELECT count(*)::int AS n FROM distributed_locks WHERE key = 'order:1'`)).rows[0].n;

    expect(await backend.tryAcquire(['order:1'], 'holder-1', 60_000)).toMatchObject({ acquired: true });
    proxy.set({ kind: 'drop' });
    await expect(backend.release(['order:1'], 'holder-1')).rejects.toBeInstanceOf(LockBackendError);
    expect(await held()).toBe(1);

    proxy.set({ kind: 'pass' });
    // Any statement answered says PostgreSQL is back; the release goes again then.
    await until(
      async () => {
        await backend.inspect('other').catch(() => undefined);
        return (await held()) === 0;
      },
      20_000,
      'the release to be sent again',
    );
  });

  it('sends the release it kept again before close() ends the pool: a statement answered just before close() leaves no key behind', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => jest.restoreAllMocks());
    const proxy = await TcpProxy.start(fixture.server.port);
    fixture.cleanup(() => proxy.close());
    const url = new URL(fixture.url);
    url.port = String(proxy.port);
    const backend = new PostgresLockBackend(url.toString(), { commandTimeout: 1_000 });
    fixture.cleanup(() => backend.close());
    const held = async () =>
      (await fixture.admin.query(`SELECT count(*)::int AS n FROM distributed_locks WHERE key = 'order:2'`)).rows[0].n;

    expect(await backend.tryAcquire(['order:2'], 'holder-2', 60_000)).toMatchObject({ acquired: true });
    proxy.set({ kind: 'drop' });
    await expect(backend.release(['order:2'], 'holder-2')).rejects.toBeInstanceOf(LockBackendError);
    proxy.set({ kind: 'pass' });
    // The first statement answered after the heal sends the kept release again, in the background;
    // the application closes right after it (a shutdown's own last release is such a statement).
    await until(
      () =>
        backend.extend(['order:other'], 'nobody', 1_000).then(
          () => true,
          () => false,
        ),
      20_000,
      'a statement answered',
    );
    await backend.close();
    expect(await held()).toBe(0);
  });

  it('frees, once closed, a lock that an acquire which timed out won while close() waited for its connection', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => jest.restoreAllMocks());
    const backend = new PostgresLockBackend(`${fixture.url}?application_name=late-close`, { commandTimeout: 300 });
    fixture.cleanup(() => backend.close());
    expect(await backend.tryAcquire(['order:warm-up'], 'warm-up', 60_000)).toMatchObject({ acquired: true });
    const blocker = await fixture.admin.connect();
    fixture.cleanup(() => blocker.release());
    await blocker.query('BEGIN');
    await blocker.query('LOCK TABLE distributed_locks IN ACCESS EXCLUSIVE MODE');
    // No onLateAcquire: the backend frees a late win itself (TryAcquireOptions.onLateAcquire).
    await expect(backend.tryAcquire(['order:3'], 'late-owner', 60_000, { willWait: false })).rejects.toThrow(
      /did not answer within 300 ms/,
    );
    // Closed while the statement is still held up; it runs, and wins, as close() waits for its connection.
    const closing = backend.close();
    await blocker.query('ROLLBACK');
    await closing;
    await until(
      async () =>
        (await fixture.admin.query(`SELECT 1 FROM pg_stat_activity WHERE application_name = 'late-close' AND state <> 'idle'`)).rowCount ===
        0,
      5_000,
      'the statement held up to be answered',
    );
    expect((await fixture.admin.query(`SELECT owner FROM distributed_locks WHERE key = 'order:3'`)).rows).toEqual([]);
  });
});
