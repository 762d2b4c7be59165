import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { inspect } from 'node:util';
import pg from 'pg';
import { PostgresLockBackend } from '../../lib/backends/postgres/postgres.backend.js';
import { postgresLockTablesSql } from '../../lib/backends/postgres/postgres.schema.js';
import { InvalidLockOptionsError, LockBackendError } from '../../lib/lock.errors.js';
import { LockService } from '../../lib/lock.service.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { activeTimers, eventually, until } from '../support/wait.js';

const fixture = usePostgresServer();

/** The connection string of the file's database, its connections named `name` in pg_stat_activity. */
function named(name: string, url = fixture.url): string {
  return `${url}?application_name=${name}`;
}

async function connections(name: string): Promise<number> {
  const { rows } = await fixture.admin.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1', [
    name,
  ]);
  return rows[0].n;
}

async function tables(schema: string): Promise<string[]> {
  const { rows } = await fixture.admin.query<{ name: string }>(
    `SELECT relname AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY relname`,
    [schema],
  );
  return rows.map((r) => r.name);
}

describe('PostgresLockBackend options', () => {
  it('refuses bad options with a typed error that says what to pass, and opens nothing', async () => {
    expect(await connections('bad-options')).toBe(0); // the admin pool's connection (and its idle timer) now exists
    const timers = activeTimers();
    const ended = new pg.Pool({ connectionString: fixture.url });
    await ended.end();
    const client = new pg.Client({ connectionString: fixture.url });
    const url = named('bad-options');
    const cases: [() => unknown, string, RegExp][] = [
      [() => new PostgresLockBackend(42 as never), 'connection', /expected a connection, got 42\. Pass a pg\.Pool/],
      [() => new PostgresLockBackend(null as never), 'connection', /got null/],
      [() => new PostgresLockBackend([] as never), 'connection', /got an array/],
      [() => new PostgresLockBackend('localhost:5432'), 'connection', /must start with postgres:\/\/ or postgresql:\/\//],
      [() => new PostgresLockBackend('not a url'), 'connection', /'not a url' is not a URL/],
      [() => new PostgresLockBackend('mysql://app:s3cret@db/app'), 'connection', /got 'mysql:\/\/'/],
      [() => new PostgresLockBackend(client as never), 'connection', /single pg\.Client.*Pass a pg\.Pool/],
      [() => new PostgresLockBackend(ended), 'connection', /closed \(end\(\) was called on it\)/],
      [() => new PostgresLockBackend(new Map() as never), 'connection', /instance of Map, which is not a pg\.Pool/],
      [() => new PostgresLockBackend({ port: '5432' as never }), 'connection', /'port' must be an integer from 1 to 65535, got '5432'/],
      [() => new PostgresLockBackend({ host: '' }), 'connection', /'host' must be a non-empty string/],
      [() => new PostgresLockBackend(url, { tabel: 'x' } as never), 'tabel', /unknown option 'tabel'\. Accepted options: schema, table/],
      [() => new PostgresLockBackend(url, { table: 'Locks' }), 'table', /lower-case letters, digits and '_'.*got 'Locks'/],
      [() => new PostgresLockBackend(url, { table: 'x'.repeat(49) }), 'table', /at most 48 characters/],
      [() => new PostgresLockBackend(url, { schema: 'my-schema' }), 'schema', /got 'my-schema'/],
      [() => new PostgresLockBackend(url, { commandTimeout: -1 }), 'commandTimeout', /positive finite number of milliseconds, got -1/],
      [() => new PostgresLockBackend(url, { waiterTimeout: Number.NaN }), 'waiterTimeout', /got NaN/],
      [() => new PostgresLockBackend(url, { createTables: 'yes' as never }), 'createTables', /must be true or false, got 'yes'/],
      [() => new PostgresLockBackend(url, { listenConnection: 42 as never }), 'listenConnection', /connection string, client settings/],
      [() => new PostgresLockBackend(url, { listenConnection: 'redis://x' }), 'listenConnection', /postgres:\/\//],
      [() => new PostgresLockBackend(url, 'fast' as never), '(options)', /options must be an object/],
      [() => postgresLockTablesSql({ table: 'a b' }), 'table', /got 'a b'/],
      [() => postgresLockTablesSql({ listenConnection: false } as never), 'listenConnection', /Accepted options: schema, table/],
    ];
    for (const [create, option, message] of cases) {
      const error = (() => {
        try {
          create();
        } catch (e) {
          return e;
        }
        return undefined;
      })();
      expect([String(create), error]).toEqual([String(create), expect.any(InvalidLockOptionsError)]);
      expect((error as InvalidLockOptionsError).option).toBe(option);
      expect((error as Error).message).toMatch(message);
      expect((error as Error).message).not.toContain('s3cret');
    }
    // Nothing behind: no connection, no timer, and the constructor that failed created no tables.
    expect(await connections('bad-options')).toBe(0);
    await eventually(() => expect(activeTimers()).toBeLessThanOrEqual(timers), 5_000);
    expect(await tables('public')).not.toContain('distributed_locks');
  });

  it('shows neither the password of its connection strings nor owner tokens when logged', async () => {
    const backend = new PostgresLockBackend(fixture.url.replace('postgres@', 'postgres:s3cret-main@'), {
      listenConnection: fixture.url.replace('postgres@', 'postgres:s3cret-listen@'),
    });
    fixture.cleanup(() => backend.close());
    await backend.tryAcquire(['k'], 'owner-token-1', 60_000);
    await backend.tryAcquire(['k'], 'owner-token-2', 60_000);
    const shown = `${inspect(backend, { depth: 10, showHidden: true })}\n${JSON.stringify(backend)}\n${String(backend)}`;
    expect(shown).toContain('public.distributed_locks');
    expect(shown).not.toMatch(/s3cret|owner-token/);
  });

  it('leaves a pg.Pool it was given open, and closes the pool and connections it created', async () => {
    const given = new pg.Pool({ connectionString: named('given-pool') });
    fixture.cleanup(() => given.end());
    const created = new PostgresLockBackend(named('created-pool'));
    for (const backend of [new PostgresLockBackend(given), created]) {
      const locks = new LockService(backend, { keyPrefix: '' });
      const held = await locks.acquire('k');
      // A waiter makes the backend LISTEN, on a connection of its own.
      const waiting = locks.acquire('k', { wait: 5_000 });
      await until(async () => (await fixture.admin.query('SELECT count(*)::int AS n FROM distributed_locks_waiters')).rows[0].n > 0, 5_000);
      await held.release();
      await (await waiting).release();
      await locks.onApplicationShutdown();
    }
    await until(async () => (await connections('created-pool')) === 0, 5_000, "the created pool's connections to close");
    expect(given.ended).toBe(false);
    expect((await given.query('SELECT 1 AS one')).rows[0].one).toBe(1);
    // Only the pool's own connections are left: the LISTEN connection was the backend's.
    await until(async () => (await connections('given-pool')) === given.totalCount, 5_000, 'the LISTEN connection to close');
  });

  it('uses the schema and table it is given, created on first use, and keeps them apart from other lock tables', async () => {
    const [app, other] = [
      new LockService(new PostgresLockBackend(fixture.url, { schema: 'app_locks', table: 'leases' }), { keyPrefix: '' }),
      new LockService(new PostgresLockBackend(fixture.url), { keyPrefix: '' }),
    ];
    fixture.cleanup(() => Promise.all([app, other].map((s) => s.onApplicationShutdown())));
    const held = await app.acquire('k');
    expect(await tables('app_locks')).toEqual([
      'leases',
      'leases_fencing_tokens',
      'leases_pkey',
      'leases_waiter_places',
      'leases_waiters',
      'leases_waiters_line',
      'leases_waiters_pkey',
    ]);
    expect((await fixture.admin.query('SELECT owner FROM app_locks.leases WHERE key = $1', ['k'])).rows).toHaveLength(1);
    // Another table, another set of locks.
    const elsewhere = await other.tryAcquire('k');
    expect(elsewhere).toBeDefined();
    await elsewhere!.release();
    await held.release();
  });

  it('creates the tables once when many instances start together', async () => {
    const services = Array.from(
      { length: 6 },
      () => new LockService(new PostgresLockBackend(fixture.url, { schema: 'together' }), { keyPrefix: '' }),
    );
    fixture.cleanup(() => Promise.all(services.map((s) => s.onApplicationShutdown())));
    let entered = 0;
    // One attempt each: a start-up that failed on another's half-created tables would show.
    await Promise.all(services.map((s, i) => s.using(`first-${i}`, () => void entered++, { wait: 0 })));
    expect(entered).toBe(6);
    expect(await tables('together')).toContain('distributed_locks');
  });

  it('with createTables: false, asks for the migration until it ran, then works', async () => {
    const locks = new LockService(new PostgresLockBackend(fixture.url, { schema: 'migrated', createTables: false }), { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const error = await locks.acquire('k', { wait: 0 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(
      /the lock table migrated\.distributed_locks .* is missing and createTables is false: run the SQL of postgresLockTablesSql\(\{ schema: 'migrated', table: 'distributed_locks' \}\) in a migration/,
    );
    expect(await tables('migrated')).toEqual([]);
    // The migration, as a team's own tool would run it.
    await fixture.admin.query(postgresLockTablesSql({ schema: 'migrated' }));
    const handle = await locks.acquire('k', { wait: 0 });
    expect(handle.fencingToken).toBe(1);
    await handle.release();
  });

  it('tells a role that may not create the tables how to fix it', async () => {
    // PostgreSQL 15 and later: only the database owner creates in schema public by default.
    await fixture.admin.query('DROP ROLE IF EXISTS app_user; CREATE ROLE app_user LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC');
    const url = fixture.url.replace('postgres@', 'app_user@');
    const locks = new LockService(new PostgresLockBackend(url, { table: 'app_locks' }), { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const error = await locks.acquire('k', { wait: 0 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(
      /could not create the lock table public\.app_locks: permission denied for schema public\. Run, as the schema's owner: GRANT CREATE ON SCHEMA public TO app_user; or create the tables in a migration/,
    );
    expect((error as LockBackendError).permanent).toBe(true);
  });

  it('refuses to run under another isolation level than READ COMMITTED, and says so', async () => {
    const pool = new pg.Pool({ connectionString: fixture.url, options: '-c default_transaction_isolation=serializable' });
    fixture.cleanup(() => pool.end());
    const locks = new LockService(new PostgresLockBackend(pool), { keyPrefix: '' });
    fixture.cleanup(() => locks.onApplicationShutdown());
    const error = await locks.acquire('k', { wait: 0 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as Error).message).toMatch(/needs READ COMMITTED, got serializable\. Give the pool .* default_transaction_isolation/);
  });

  it('falls back to polling, with one warning, when LISTEN delivers nothing; and polls quietly with listenConnection: false', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    // NOTIFY reaches listeners of the same database only: LISTEN on another one hears nothing, as
    // through a pooler in transaction mode.
    const elsewhere = await fixture.server.createDatabase('elsewhere');
    for (const listenConnection of [elsewhere, false] as const) {
      warn.mockClear();
      const holder = new LockService(new PostgresLockBackend(fixture.url), { keyPrefix: '' });
      const waiters = new LockService(new PostgresLockBackend(named('polling'), { listenConnection }), {
        keyPrefix: '',
        pollInterval: 100,
      });
      fixture.cleanup(() => Promise.all([holder, waiters].map((s) => s.onApplicationShutdown())));
      const held = await holder.acquire('k', { ttl: 60_000 });
      const both = [waiters.acquire('k', { wait: 10_000 }), waiters.acquire('k', { wait: 10_000 })];
      await until(async () => (await fixture.admin.query('SELECT count(*)::int AS n FROM distributed_locks_waiters')).rows[0].n > 0, 5_000);
      await held.release();
      const first = await both[0];
      await first.release();
      await (await both[1]).release();
      expect(waiters.backend.watching?.([])).toBe(false);
      const warnings = warn.mock.calls.map(([message]) => String(message)).filter((m) => m.includes('LISTEN'));
      if (listenConnection === false) expect(warnings).toEqual([]);
      else
        expect(warnings).toEqual([expect.stringMatching(/LISTEN delivered nothing .* waiters of this process poll .* listenConnection/)]);
      await Promise.all([holder, waiters].map((s) => s.onApplicationShutdown()));
    }
  });
});
