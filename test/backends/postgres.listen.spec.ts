import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { LockService, PostgresLockBackend } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { until } from '../support/wait.js';

const fixture = usePostgresServer();

describe('PostgreSQL backend: its LISTEN connection', () => {
  it('a LISTEN connection that drops during its first check is made again: waiters wake by notification, and no pooler is blamed', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    // Lock statements go through a proxy that the test slows down while the waiter's process checks
    // its LISTEN connection (direct), so the check's message is still on its way when the test
    // ends that connection.
    const proxy = await TcpProxy.start(fixture.server.port);
    fixture.cleanup(() => proxy.close());
    const pooled = new URL(fixture.url);
    pooled.port = String(proxy.port);
    const holder = new LockService(new PostgresLockBackend(fixture.url), { keyPrefix: '' });
    // Polls only once a minute: a waiter that polls would not get the key within the test.
    const backend = new PostgresLockBackend(pooled.toString(), { listenConnection: fixture.url, waiterTimeout: 120_000 });
    const waiterService = new LockService(backend, { keyPrefix: '', pollInterval: 60_000 });
    fixture.cleanup(() => Promise.all([holder.onApplicationShutdown(), waiterService.onApplicationShutdown()]));

    const held = await holder.acquire('report', { ttl: 120_000 });
    expect(await waiterService.tryAcquire('report')).toBeUndefined(); // creates the pool, outside the slow window
    proxy.set({ kind: 'delay', ms: 1_500, direction: 'up' });
    const waiting = waiterService.acquire('report', { wait: 100_000, ttl: 5_000 });

    // The LISTEN connection has listened and sent its check through the slow pool: end it.
    let terminated = false;
    await until(
      async () => {
        const { rows } = await fixture.admin.query<{ done: boolean }>(
          `SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity WHERE query = $1`,
          [`LISTEN "${backend.channel}"`],
        );
        terminated = rows.some((r) => r.done);
        return terminated;
      },
      20_000,
      'the LISTEN connection',
    );
    proxy.set({ kind: 'pass' });

    await until(() => backend.watching(), 20_000, 'the backend to listen again');
    await held.release();
    const handle = await waiting;
    expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
    await handle.release();
    expect(warn.mock.calls.map(([message]) => String(message)).filter((m) => m.includes('pgbouncer'))).toEqual([]);
  });

  it('a pool slow to answer the check: the wait for its message starts once it was sent, and the backend listens', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    // Lock statements through one proxy, the LISTEN connection through another. The check's NOTIFY
    // is answered late (3.2 s of the 4 s budget) and its message takes 1 s more to arrive: heard
    // within the budget counted from the answer, not from the moment it was sent.
    const [pooledProxy, listenProxy] = await Promise.all([TcpProxy.start(fixture.server.port), TcpProxy.start(fixture.server.port)]);
    fixture.cleanup(() => Promise.all([pooledProxy.close(), listenProxy.close()]));
    const [pooled, listen] = [new URL(fixture.url), new URL(fixture.url)];
    pooled.port = String(pooledProxy.port);
    listen.port = String(listenProxy.port);
    const holder = new LockService(new PostgresLockBackend(fixture.url), { keyPrefix: '' });
    const backend = new PostgresLockBackend(pooled.toString(), {
      listenConnection: listen.toString(),
      commandTimeout: 4_000,
      waiterTimeout: 120_000,
    });
    const waiterService = new LockService(backend, { keyPrefix: '', pollInterval: 60_000 });
    fixture.cleanup(() => Promise.all([holder.onApplicationShutdown(), waiterService.onApplicationShutdown()]));

    const held = await holder.acquire('report', { ttl: 120_000 });
    // Opens two of the pool's connections, outside the slow window.
    await Promise.all([backend.inspect('a'), backend.inspect('b')]);
    pooledProxy.set({ kind: 'delay', ms: 3_200, direction: 'up' });
    listenProxy.set({ kind: 'delay', ms: 1_000 });
    const waiting = waiterService.acquire('report', { wait: 100_000, ttl: 5_000 });

    await until(() => backend.watching(), 30_000, 'the backend to listen');
    pooledProxy.set({ kind: 'pass' });
    listenProxy.set({ kind: 'pass' });
    await held.release();
    await (await waiting).release();
    expect(warn.mock.calls.map(([message]) => String(message)).filter((m) => m.includes('pgbouncer'))).toEqual([]);
  });
});
