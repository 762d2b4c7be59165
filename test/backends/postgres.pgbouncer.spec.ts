import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import pg from 'pg';
import { PostgresLockBackend } from '../../lib/backends/postgres/postgres.backend.js';
import { LockService } from '../../lib/lock.service.js';
import { describeBackendConformance } from '../conformance/lock-backend.conformance.js';
import { PgBouncer } from '../support/pgbouncer.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { until } from '../support/wait.js';

// Lock statements go through a pgbouncer in transaction mode; LISTEN goes direct, as documented.
const fixture = usePostgresServer();
let bouncer: PgBouncer;
/** The file's database through pgbouncer. */
let pooled: string;

beforeAll(async () => {
  bouncer = await PgBouncer.start(fixture.server.port);
  pooled = bouncer.url(new URL(fixture.url).pathname.slice(1));
}, 30_000);
afterAll(async () => {
  await bouncer?.stop();
});

describeBackendConformance('postgres through pgbouncer (transaction mode)', {
  connect: async () => new PostgresLockBackend(pooled, { waiterTimeout: 120_000, listenConnection: fixture.url }),
});

describe('PostgreSQL backend behind pgbouncer in transaction mode', () => {
  it('session advisory locks do not exclude through it: two clients both get the same one', async () => {
    // The measurement behind the design: a session lock stays on the server connection, which the
    // pooler hands to the next client once the transaction is over.
    const [a, b] = [new pg.Client({ connectionString: pooled }), new pg.Client({ connectionString: pooled })];
    await Promise.all([a.connect(), b.connect()]);
    fixture.cleanup(() => Promise.all([a.end(), b.end()]));
    const got = async (client: pg.Client) => (await client.query('SELECT pg_try_advisory_lock(42) AS got')).rows[0].got as boolean;
    expect(await got(a)).toBe(true);
    expect(await got(b)).toBe(true);
    await a.query('SELECT pg_advisory_unlock_all()');
  });

  it('without a direct connection for LISTEN, it warns once and its waiters poll, and still take turns', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const services = [0, 1].map(() => new LockService(new PostgresLockBackend(pooled), { keyPrefix: '', pollInterval: 100 }));
    fixture.cleanup(() => Promise.all(services.map((s) => s.onApplicationShutdown())));
    const held = await services[0].acquire('k', { ttl: 60_000 });
    const waiting = services[1].acquire('k', { wait: 10_000 });
    await until(async () => (await fixture.admin.query('SELECT count(*)::int AS n FROM distributed_locks_waiters')).rows[0].n > 0, 5_000);
    await held.release();
    const handle = await waiting;
    expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
    await handle.release();
    expect(services[1].backend.watching?.([])).toBe(false);
    expect(warn.mock.calls.map(([message]) => String(message)).filter((m) => m.includes('LISTEN'))).toEqual([
      expect.stringMatching(/LISTEN delivered nothing .*pgbouncer.* listenConnection/),
    ]);
  });

  it('sends its statements unnamed from the first named one the pooler refuses, which runs again unnamed', async () => {
    // One server connection for every client: the second backend's pool finds the first one's
    // named statements there ("already exists"), as pgbouncer before 1.21 shows them to anyone.
    const narrow = await PgBouncer.start(fixture.server.port, { poolSize: 1 });
    fixture.cleanup(() => narrow.stop());
    const url = narrow.url(new URL(fixture.url).pathname.slice(1));
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const [first, second] = [0, 1].map(() => new PostgresLockBackend(url, { listenConnection: false }));
    fixture.cleanup(() => Promise.all([first.close(), second.close()]));
    expect((await first.tryAcquire(['named'], 'a', 30_000)).acquired).toBe(true);
    const refusals = () => warn.mock.calls.map(([message]) => String(message)).filter((m) => m.includes('named prepared statement'));
    expect(refusals()).toEqual([]);
    expect(await second.tryAcquire(['named'], 'b', 30_000, { willWait: false })).toMatchObject({ acquired: false });
    expect(refusals()).toEqual([expect.stringMatching(/already exists.*sent unnamed from now on/)]);
    expect(await second.release(['named'], 'b')).toBe(false);
    expect(await first.release(['named'], 'a')).toBe(true);
    expect((await second.tryAcquire(['named'], 'b', 30_000)).acquired).toBe(true);
    expect(refusals()).toHaveLength(1);
  });
});
