import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import pg from 'pg';
import { SHARED } from '../../lib/backends/lock-backend.interface.js';
import { FUNCTIONS_REVISION } from '../../lib/backends/postgres/postgres.functions.js';
import { acquireSignature, lockNames, SCHEMA_VERSION } from '../../lib/backends/postgres/postgres.schema.js';
import { LockBackendError, PostgresLockBackend, postgresLockTablesSql } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { until } from '../support/wait.js';

/** The previous release's tables (version 3), as its postgresLockTablesSql() creates them. */
const VERSION_3_SQL = readFileSync(resolve(import.meta.dirname, '../fixtures/postgres-tables-v3.sql'), 'utf8');

const fixture = usePostgresServer();
let databases = 0;

/** A database of its own, with a pool on it, closed after the test. */
async function database(): Promise<{ url: string; db: pg.Pool }> {
  const url = await fixture.server.createDatabase(`layout_${++databases}`);
  const db = new pg.Pool({ connectionString: url, max: 2 });
  fixture.cleanup(() => db.end());
  return { url, db };
}

function backend(url: string, options: ConstructorParameters<typeof PostgresLockBackend>[1] = {}): PostgresLockBackend {
  const created = new PostgresLockBackend(url, { listenConnection: false, ...options });
  fixture.cleanup(() => created.close());
  return created;
}

/** A process of the previous release: the statements its backend sends. */
function previousRelease(db: pg.Pool) {
  return {
    /** Creates or brings up its tables, as its backend does on first use (in one transaction). */
    async createTables(): Promise<void> {
      const client = await db.connect();
      try {
        await client.query('BEGIN');
        await client.query(VERSION_3_SQL);
        await client.query('COMMIT');
      } catch (error) {
        await client.query('ROLLBACK');
        throw error;
      } finally {
        client.release();
      }
    },
    async acquire(key: string, owner: string): Promise<{ acquired: boolean; token: string }> {
      const { rows } = await db.query('SELECT acquired, token FROM distributed_locks_acquire($1, $2, $3, $4, $5, $6)', [
        [key],
        owner,
        30_000,
        3_000,
        false,
        'ndl_old',
      ]);
      return rows[0];
    },
    async release(key: string, owner: string): Promise<number> {
      return (await db.query('SELECT distributed_locks_release($1, $2) AS released', [[key], owner])).rows[0].released;
    },
  };
}

async function version(db: pg.Pool): Promise<string> {
  return (await db.query(`SELECT obj_description('distributed_locks'::regclass, 'pg_class') AS v`)).rows[0].v;
}

describe('PostgreSQL lock tables: version 4 (several holders per key) next to the previous release', () => {
  it('tables of version 3 are brought to version 4 in place: a lease held there stays held, and tokens go on', async () => {
    const { url, db } = await database();
    const old = previousRelease(db);
    await old.createTables();
    const held = await old.acquire('held', 'old-owner');
    expect(held.acquired).toBe(true);
    const b = backend(url);
    expect(await b.tryAcquire(['held'], 'reader', 30_000, { limits: [SHARED], willWait: false })).toMatchObject({ acquired: false });
    expect(await version(db)).toBe(SCHEMA_VERSION);
    expect(await b.inspect('held')).toMatchObject({ owner: 'old-owner', fencingToken: Number(held.token) });
    const next = await b.tryAcquire(['other'], 'reader', 30_000, { limits: [SHARED] });
    expect(next).toMatchObject({ acquired: true, fencingToken: Number(held.token) + 1 });
  });

  it('a process of the previous release still running takes keys as an exclusive caller of the same line', async () => {
    const { url, db } = await database();
    const old = previousRelease(db);
    await old.createTables();
    const b = backend(url);
    expect((await b.tryAcquire(['k'], 'reader', 30_000, { limits: [SHARED] })).acquired).toBe(true);
    expect((await old.acquire('k', 'old-owner')).acquired).toBe(false);
    await b.release(['k'], 'reader');
    expect((await old.acquire('k', 'old-owner')).acquired).toBe(true);
    expect(await b.tryAcquire(['k'], 'reader-2', 30_000, { limits: [SHARED], willWait: false })).toMatchObject({ acquired: false });
    expect(await old.release('k', 'old-owner')).toBe(1);
    expect((await b.tryAcquire(['k'], 'reader-2', 30_000, { limits: [SHARED] })).acquired).toBe(true);
  });

  it('a process of the previous release that starts later cannot put its functions back: it is told to update', async () => {
    const { url, db } = await database();
    const b = backend(url);
    expect((await b.tryAcquire(['k'], 'reader', 30_000, { limits: [SHARED] })).acquired).toBe(true);
    await expect(previousRelease(db).createTables()).rejects.toThrow(
      'cannot change name of input parameter "lock tables at version 4: update nest-distributed-lock"',
    );
    expect(await version(db)).toBe(SCHEMA_VERSION);
    expect((await b.tryAcquire(['k'], 'reader-2', 30_000, { limits: [SHARED] })).acquired).toBe(true);
  });

  it('running the tables SQL again changes nothing: holders, lines and the version stay', async () => {
    const { url, db } = await database();
    const b = backend(url);
    expect((await b.tryAcquire(['k'], 'reader', 30_000, { limits: [SHARED] })).acquired).toBe(true);
    await db.query(postgresLockTablesSql());
    expect(await version(db)).toBe(SCHEMA_VERSION);
    expect(await b.inspect('k')).toMatchObject({ limit: SHARED, holders: [{ owner: 'reader' }] });
  });

  it('tables of a later version are refused, with what to do, rather than used or changed back', async () => {
    const { url, db } = await database();
    await db.query(postgresLockTablesSql());
    await db.query(`COMMENT ON TABLE distributed_locks IS 'nest-distributed-lock lock table, version 5'`);
    const attempt = backend(url).tryAcquire(['k'], 'owner', 30_000);
    await expect(attempt).rejects.toThrow(LockBackendError);
    await expect(attempt).rejects.toMatchObject({ permanent: true });
    await expect(attempt).rejects.toThrow(/is at version 5, made by a newer release .* update nest-distributed-lock/);
    expect(await version(db)).toBe('nest-distributed-lock lock table, version 5');
  });

  it('with createTables: false, tables of version 3 are refused until the migration brings them up', async () => {
    const { url, db } = await database();
    await previousRelease(db).createTables();
    const attempt = backend(url, { createTables: false }).tryAcquire(['k'], 'owner', 30_000);
    await expect(attempt).rejects.toMatchObject({ permanent: true });
    await expect(attempt).rejects.toThrow(/is at version 3 and createTables is false: run the SQL of postgresLockTablesSql/);
    await db.query(postgresLockTablesSql());
    expect((await backend(url, { createTables: false }).tryAcquire(['k'], 'owner', 30_000)).acquired).toBe(true);
  });
});

/** The release before who holds was stored (version 4, without its columns), as its postgresLockTablesSql() creates them. */
const VERSION_4_SQL = readFileSync(resolve(import.meta.dirname, '../fixtures/postgres-tables-v4.sql'), 'utf8');

/** A process of that release: the statements its backend sends. */
function releaseBeforeIdentity(db: pg.Pool) {
  return {
    async createTables(): Promise<void> {
      await db.query(VERSION_4_SQL);
    },
    async acquire(key: string, owner: string, willWait = false): Promise<{ acquired: boolean; token: string }> {
      const { rows } = await db.query('SELECT acquired, token FROM distributed_locks_acquire($1, $2, $3, $4, $5, $6, $7)', [
        [key],
        owner,
        30_000,
        3_000,
        willWait,
        'ndl_old',
        null,
      ]);
      return rows[0];
    },
    async release(key: string, owner: string): Promise<number> {
      return (await db.query('SELECT distributed_locks_release($1, $2) AS released', [[key], owner])).rows[0].released;
    },
  };
}

const holder = { instance: 'web-1', site: 'Orders.pay' };

describe('PostgreSQL lock tables: who holds, next to the release before it', () => {
  it('tables of that release get the columns in place, keep their version, and its leases stay held', async () => {
    const { url, db } = await database();
    const old = releaseBeforeIdentity(db);
    await old.createTables();
    const held = await old.acquire('held', 'old-owner');
    const b = backend(url);
    expect((await b.tryAcquire(['k'], 'new-owner', 30_000, { holder })).acquired).toBe(true);
    expect(await version(db)).toBe(SCHEMA_VERSION);
    const old_ = await b.inspect('held');
    expect(old_).toMatchObject({ owner: 'old-owner', fencingToken: Number(held.token), holders: [{ owner: 'old-owner' }] });
    expect(old_?.holders?.[0].instance).toBeUndefined();
    expect((await b.inspect('k'))?.holders?.[0]).toMatchObject({ owner: 'new-owner', ...holder, acquiredAt: expect.any(Number) });
  });

  it('its processes still running, and those that start later, take and release keys in the same line', async () => {
    const { url, db } = await database();
    const old = releaseBeforeIdentity(db);
    await old.createTables();
    const b = backend(url);
    expect((await b.tryAcquire(['k'], 'new-owner', 30_000, { holder })).acquired).toBe(true);
    // It waits behind the new holder, unnamed in the line; the release hands it the key.
    expect((await old.acquire('k', 'old-owner', true)).acquired).toBe(false);
    expect((await b.inspect('k'))?.waiters).toEqual([{ owner: 'old-owner', waitingSince: expect.any(Number) }]);
    await b.release(['k'], 'new-owner');
    expect(await b.inspect('k')).toMatchObject({ owner: 'old-owner', holders: [{ owner: 'old-owner' }] });
    expect(await old.release('k', 'old-owner')).toBe(1);
    // Its SQL run again (a process of it starting, or its migration): nothing breaks.
    await old.createTables();
    expect(await version(db)).toBe(SCHEMA_VERSION);
    expect((await old.acquire('k', 'old-owner-2')).acquired).toBe(true);
    expect(await b.tryAcquire(['k'], 'new-2', 30_000, { holder, willWait: false })).toMatchObject({ acquired: false });
    expect(await old.release('k', 'old-owner-2')).toBe(1);
    expect((await b.tryAcquire(['k'], 'new-2', 30_000, { holder })).acquired).toBe(true);
  });

  it('with createTables: false, its tables are refused until the migration adds the columns', async () => {
    const { url, db } = await database();
    await releaseBeforeIdentity(db).createTables();
    const attempt = backend(url, { createTables: false }).tryAcquire(['k'], 'owner', 30_000);
    await expect(attempt).rejects.toMatchObject({ permanent: true });
    await expect(attempt).rejects.toThrow(/at version 4 without the columns of who holds .* run the SQL of postgresLockTablesSql/);
    await db.query(postgresLockTablesSql());
    expect((await backend(url, { createTables: false }).tryAcquire(['k'], 'owner', 30_000, { holder })).acquired).toBe(true);
  });
});

describe('PostgreSQL lock functions of an earlier revision, on tables of this version', () => {
  /**
   * Tables of this version as the releases before revision 2 of the functions leave them, or as
   * their SQL run again over this release's (a rollback) does: bodies without the revision's line.
   */
  async function earlierRevision(db: pg.Pool, afterThisRelease = false): Promise<void> {
    if (afterThisRelease) await db.query(postgresLockTablesSql());
    await db.query(postgresLockTablesSql().replace(`-- ${FUNCTIONS_REVISION}\n`, ''));
  }
  const revision = async (db: pg.Pool) =>
    (
      await db.query(`SELECT position($2 IN prosrc) > 0 AS r FROM pg_proc WHERE oid = to_regprocedure($1)`, [
        acquireSignature(lockNames('public', 'distributed_locks')),
        FUNCTIONS_REVISION,
      ])
    ).rows[0].r;

  it('are put back on first use, keeping the version', async () => {
    const { url, db } = await database();
    await earlierRevision(db);
    expect(await revision(db)).toBe(false);
    expect((await backend(url).tryAcquire(['k'], 'owner', 30_000)).acquired).toBe(true);
    expect(await revision(db)).toBe(true);
    expect(await version(db)).toBe(SCHEMA_VERSION);
  });

  it('are put back on first use after the SQL of an earlier release ran again over them (a rollback)', async () => {
    const { url, db } = await database();
    await earlierRevision(db, true);
    expect(await revision(db)).toBe(false);
    expect((await backend(url).tryAcquire(['k'], 'owner', 30_000)).acquired).toBe(true);
    expect(await revision(db)).toBe(true);
  });

  it('with createTables: false, are used as they are (with a warning) until the migration replaces them', async () => {
    const { url, db } = await database();
    await earlierRevision(db);
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      expect((await backend(url, { createTables: false }).tryAcquire(['k'], 'owner', 30_000)).acquired).toBe(true);
      expect(warn).toHaveBeenCalledWith(expect.stringMatching(/of an earlier release .*postgresLockTablesSql/));
    } finally {
      warn.mockRestore();
    }
    expect(await revision(db)).toBe(false);
  });
});

describe('PostgreSQL key locks of a call of one key', () => {
  it('are the lock _lock_keys takes, as calls of several keys and every call of the previous release do: acquire, extend and release wait for it', async () => {
    const { url, db } = await database();
    const locks = backend(url);
    expect((await locks.tryAcquire(['k'], 'a', 30_000)).acquired).toBe(true);
    const calls: Record<string, () => Promise<unknown>> = {
      acquire: () => locks.tryAcquire(['k'], 'b', 30_000, { willWait: false }),
      extend: () => locks.extend(['k'], 'a', 30_000),
      release: () => locks.release(['k'], 'a'),
    };
    const waiting = async () =>
      (await db.query(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`)).rows[0].n as number;
    for (const [op, call] of Object.entries(calls)) {
      const other = await db.connect();
      try {
        await other.query('BEGIN');
        await other.query('SELECT distributed_locks_lock_keys($1)', [['k', 'l']]);
        let answered = false;
        const running = call().finally(() => (answered = true));
        await until(async () => (await waiting()) === 1, 5_000, `the ${op} of k to wait for its key lock`);
        expect(answered).toBe(false);
        await other.query('COMMIT');
        await running;
      } finally {
        other.release();
      }
    }
    expect(await locks.inspect('k')).toBeUndefined();
  });
});

describe('PostgreSQL lines of a call of one key', () => {
  it('a waiter that enters by asking again (the lease before it ran out) leaves the line: the next caller is not kept out by it', async () => {
    const { url, db } = await database();
    const locks = backend(url, { waiterTimeout: 60_000 });
    expect((await locks.tryAcquire(['q'], 'a', 300)).acquired).toBe(true);
    expect((await locks.tryAcquire(['q'], 'b', 300)).acquired).toBe(false);
    expect((await db.query('SELECT count(*)::int AS n FROM distributed_locks_waiters')).rows[0].n).toBe(1);
    await until(async () => (await locks.tryAcquire(['q'], 'b', 300)).acquired, 5_000, 'b to enter once the lease of a ran out');
    expect((await db.query('SELECT count(*)::int AS n FROM distributed_locks_waiters')).rows[0].n).toBe(0);
    await until(
      async () => (await locks.tryAcquire(['q'], 'c', 300, { willWait: false })).acquired,
      5_000,
      'c to enter once the lease of b ran out',
    );
  });
});
