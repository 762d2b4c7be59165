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
});
