import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import pg from 'pg';
import { LockBackendError, LockService, PostgresLockBackend } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { until } from '../support/wait.js';

const fixture = usePostgresServer();

describe("PostgreSQL backend on the application's own pg.Pool", () => {
  it('handlers that hold every connection of the pool in a transaction while they lock: it warns, with the numbers', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const pool = new pg.Pool({ connectionString: fixture.url, max: 2 });
    fixture.cleanup(() => pool.end());
    const locks = new LockService(new PostgresLockBackend(pool), { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    await (await locks.acquire('order:1')).release(); // creates the tables

    // Two request handlers, each in a transaction on one of the pool's two connections.
    const handlers = await Promise.all([pool.connect(), pool.connect()]);
    for (const client of handlers) await client.query('BEGIN');
    const locking = locks.acquire('order:1', { wait: 60_000 });
    await until(() => warn.mock.calls.some(([m]) => String(m).includes('pg.Pool')), 20_000, 'the warning');
    const message = warn.mock.calls.map(([m]) => String(m)).find((m) => m.includes('pg.Pool'))!;
    expect(message).toMatch(
      /has waited \d+ ms for a connection of the pg.Pool given to PostgresLockBackend: the pool's max is 2, 2 of its 2 connections are checked out, and 1 clients wait for one\..*pool of its own/,
    );

    // The handlers end: the lock goes on.
    for (const client of handlers) {
      await client.query('COMMIT');
      client.release();
    }
    await (await locking).release();
  });

  it('a connection that drops while a lock statement is in flight: the caller is told or gets its lock, the process lives on', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    // An error nobody listens for would end the process; Jest would fail the file. Seen here, by the test.
    const uncaught: unknown[] = [];
    const onUncaught = (error: unknown) => void uncaught.push(error);
    process.on('uncaughtException', onUncaught);
    fixture.cleanup(() => process.off('uncaughtException', onUncaught));
    const proxy = await TcpProxy.start(fixture.server.port);
    fixture.cleanup(() => proxy.close());
    const url = new URL(fixture.url);
    url.port = String(proxy.port);
    // The app's pool, with its own listener for idle connections that break, as pg asks of an app.
    const pool = new pg.Pool({ connectionString: url.toString(), max: 2 }).on('error', () => undefined);
    fixture.cleanup(() => pool.end());
    const locks = new LockService(new PostgresLockBackend(pool, { commandTimeout: 60_000 }), { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    await (await locks.acquire('order:1')).release(); // creates the tables

    // A migration holds the lock table: the acquire's statement waits behind it, in flight.
    const migration = await fixture.admin.connect();
    fixture.cleanup(() => migration.release());
    await migration.query('BEGIN');
    await migration.query('LOCK TABLE distributed_locks IN ACCESS EXCLUSIVE MODE');
    const locking = locks.acquire('order:1', { wait: 60_000 }).then(
      (handle) => handle,
      (error: unknown) => error,
    );
    await until(
      async () =>
        (
          await fixture.admin.query(
            `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%_acquire%'`,
          )
        ).rows[0].n > 0,
      20_000,
      'the acquire to wait behind the table lock',
    );
    proxy.set({ kind: 'drop' });
    proxy.set({ kind: 'pass' });
    await migration.query('COMMIT');

    const outcome = await locking;
    if (outcome instanceof Error) expect(outcome).toBeInstanceOf(LockBackendError);
    else await (outcome as { release(): Promise<unknown> }).release();
    expect(uncaught).toEqual([]);
  });
});
