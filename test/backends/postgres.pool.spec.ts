import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import pg from 'pg';
import { LockService, PostgresLockBackend } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
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
});
