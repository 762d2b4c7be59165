import { describe, expect, it } from '@jest/globals';
import mysql from 'mysql2/promise';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { SHARED } from '../../lib/backends/lock-backend.interface.js';
import { MYSQL_KEY_TABLE_COMMENT, MYSQL_SCHEMA_VERSION } from '../../lib/backends/mysql/mysql.schema.js';
import { LockBackendError, MysqlLockBackend, mysqlLockTablesSql } from '../../lib/index.js';
import { useMariadbServer } from '../support/mariadb-fixture.js';

/** The previous release's statements (one lease per key, in the key's row), as its mysqlLockTablesSql() gives them. */
const VERSION_1: string[] = JSON.parse(readFileSync(resolve(import.meta.dirname, '../fixtures/mysql-tables-v1.json'), 'utf8'));

const fixture = useMariadbServer();
let tables = 0;

/** A lock table of the test's own, and a pool on the database, closed after the test. */
function place(): { table: string; db: mysql.Pool } {
  const table = `layout_${++tables}`;
  const db = mysql.createPool({ uri: fixture.url, connectionLimit: 4 });
  fixture.cleanup(() => db.end());
  return { table, db };
}

function backend(table: string, options: ConstructorParameters<typeof MysqlLockBackend>[1] = {}): MysqlLockBackend {
  const created = new MysqlLockBackend(fixture.url, { table, ...options });
  fixture.cleanup(() => created.close());
  return created;
}

const hex = (key: string) => Buffer.from(key).toString('hex');

/** A process of the previous release on `table`: the statements its backend sends. */
function previousRelease(db: mysql.Pool, table: string) {
  const statements = VERSION_1.map((sql) => sql.replaceAll('distributed_locks', table));
  return {
    /** What its backend does on first use: runs its statements unless the key table's comment is its version. */
    async start(): Promise<void> {
      const [[found]] = await db.query<mysql.RowDataPacket[]>(
        'SELECT TABLE_COMMENT AS version FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?',
        [table],
      );
      if (found?.version === 'nest-distributed-lock lock table, version 1') return;
      for (const sql of statements) await db.query(sql);
    },
    async acquire(key: string, owner: string): Promise<{ acquired: number; token: number | null }> {
      const [[rows]] = await db.query<mysql.RowDataPacket[][]>(`CALL ${table}_acquire(?, ?, ?, ?, ?)`, [
        hex(key),
        owner,
        30_000,
        3_000,
        false,
      ]);
      return { acquired: Number(rows[0].acquired), token: rows[0].token === null ? null : Number(rows[0].token) };
    },
    async release(key: string, owner: string): Promise<number> {
      const [[rows]] = await db.query<mysql.RowDataPacket[][]>(`CALL ${table}_release(?, ?)`, [hex(key), owner]);
      return Number(rows[0].released);
    },
  };
}

async function comment(db: mysql.Pool, table: string): Promise<string | undefined> {
  const [[row]] = await db.query<mysql.RowDataPacket[]>(
    'SELECT TABLE_COMMENT AS c FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?',
    [table],
  );
  return row?.c as string | undefined;
}

describe('MySQL lock tables: version 2 (several holders per key) next to the previous release', () => {
  it('tables of version 1 are brought to version 2 in place: a lease held there stays held, and tokens go on', async () => {
    const { table, db } = place();
    const old = previousRelease(db, table);
    await old.start();
    const held = await old.acquire('held', 'old-owner');
    expect(held.acquired).toBe(1);
    const b = backend(table);
    expect(await b.tryAcquire(['held'], 'reader', 30_000, { limits: [SHARED], willWait: false })).toMatchObject({ acquired: false });
    expect(await comment(db, `${table}_holders`)).toBe(MYSQL_SCHEMA_VERSION);
    expect(await comment(db, table)).toBe(MYSQL_KEY_TABLE_COMMENT);
    expect(await b.inspect('held')).toMatchObject({ owner: 'old-owner', fencingToken: held.token });
    expect(await b.tryAcquire(['other'], 'reader', 30_000, { limits: [SHARED] })).toMatchObject({
      acquired: true,
      fencingToken: held.token! + 1,
    });
    // The old holder's release frees it.
    expect(await old.release('held', 'old-owner')).toBe(1);
    expect((await b.tryAcquire(['held'], 'reader', 30_000, { limits: [SHARED] })).acquired).toBe(true);
  });

  it('a process of the previous release, running on or started later, takes keys as an exclusive caller of the same line', async () => {
    const { table, db } = place();
    const old = previousRelease(db, table);
    await old.start();
    const b = backend(table);
    expect((await b.tryAcquire(['k'], 'reader', 30_000, { limits: [SHARED] })).acquired).toBe(true);
    expect((await old.acquire('k', 'old-owner')).acquired).toBe(0);
    // One that starts now finds what it checks, and puts none of its procedures back.
    await previousRelease(db, table).start();
    expect((await old.acquire('k', 'old-owner')).acquired).toBe(0);
    expect(await b.release(['k'], 'reader')).toBe(true);
    expect((await old.acquire('k', 'old-owner')).acquired).toBe(1);
    expect(await b.tryAcquire(['k'], 'reader-2', 30_000, { limits: [SHARED], willWait: false })).toMatchObject({ acquired: false });
    expect(await b.inspect('k')).toMatchObject({ owner: 'old-owner' });
    expect(await old.release('k', 'old-owner')).toBe(1);
    expect((await b.tryAcquire(['k'], 'reader-2', 30_000, { limits: [SHARED] })).acquired).toBe(true);
  });

  it("a call of the previous release in flight while the tables are brought up: its lease is kept, not lost beside a reader's", async () => {
    const { table, db } = place();
    await previousRelease(db, table).start();
    // Sessions that read committed rows only: the upgrade must wait for the call, not read past it.
    await fixture.admin.query("SET GLOBAL tx_isolation = 'READ-COMMITTED'");
    fixture.cleanup(() => fixture.admin.query("SET GLOBAL tx_isolation = 'REPEATABLE-READ'"));
    // What the previous release's acquire does, stopped between its key lock and its commit.
    const call = await mysql.createConnection(fixture.url);
    fixture.cleanup(() => call.end());
    await call.query('SET TRANSACTION ISOLATION LEVEL READ COMMITTED');
    await call.query('START TRANSACTION');
    await call.query(`CALL ${table}_lock_keys(?)`, [hex('in-flight')]);
    await call.query(
      `UPDATE ${table} SET owner = 'old-owner', fencing_token = 7, expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND WHERE lock_key = ?`,
      [Buffer.from('in-flight')],
    );
    const b = backend(table, { commandTimeout: 20_000 });
    const reader = b.tryAcquire(['in-flight'], 'reader', 30_000, { limits: [SHARED], willWait: false });
    // The upgrade waits for the call's transaction.
    await new Promise((resolve) => setTimeout(resolve, 300));
    await call.query('COMMIT');
    expect(await reader).toMatchObject({ acquired: false });
    expect(await b.inspect('in-flight')).toMatchObject({ owner: 'old-owner', fencingToken: 7 });
  });

  it('running the statements again changes nothing: holders, lines and the version stay', async () => {
    const { table, db } = place();
    const b = backend(table);
    expect((await b.tryAcquire(['k'], 'reader', 30_000, { limits: [SHARED] })).acquired).toBe(true);
    expect((await b.tryAcquire(['k'], 'writer', 30_000)).acquired).toBe(false);
    for (const sql of mysqlLockTablesSql({ table })) await db.query(sql);
    expect(await comment(db, `${table}_holders`)).toBe(MYSQL_SCHEMA_VERSION);
    expect(await b.inspect('k')).toMatchObject({ limit: SHARED, holders: [{ owner: 'reader' }] });
    expect((await b.tryAcquire(['k'], 'late-reader', 30_000, { limits: [SHARED], willWait: false })).acquired).toBe(false);
  });

  it('tables of a later version are refused, with what to do, rather than used or changed back', async () => {
    const { table, db } = place();
    for (const sql of mysqlLockTablesSql({ table })) await db.query(sql);
    await db.query(`ALTER TABLE ${table}_holders COMMENT = 'nest-distributed-lock lock table, version 3'`);
    const attempt = backend(table).tryAcquire(['k'], 'owner', 30_000);
    await expect(attempt).rejects.toThrow(LockBackendError);
    await expect(attempt).rejects.toMatchObject({ permanent: true });
    await expect(attempt).rejects.toThrow(/is at version 3, made by a newer release .* update nest-distributed-lock/);
    expect(await comment(db, `${table}_holders`)).toBe('nest-distributed-lock lock table, version 3');
  });

  it('with createTables: false, tables of version 1 are refused until the migration brings them up', async () => {
    const { table, db } = place();
    await previousRelease(db, table).start();
    const attempt = backend(table, { createTables: false }).tryAcquire(['k'], 'owner', 30_000);
    await expect(attempt).rejects.toMatchObject({ permanent: true });
    await expect(attempt).rejects.toThrow(/is at version 1 and createTables is false: run the statements of mysqlLockTablesSql/);
    for (const sql of mysqlLockTablesSql({ table })) await db.query(sql);
    expect((await backend(table, { createTables: false }).tryAcquire(['k'], 'owner', 30_000)).acquired).toBe(true);
  });
});

/** The release before who holds was stored (version 2, without its columns), as its mysqlLockTablesSql() gives them. */
const VERSION_2: string[] = JSON.parse(readFileSync(resolve(import.meta.dirname, '../fixtures/mysql-tables-v2.json'), 'utf8'));

/** A process of that release on `table`: the statements its backend sends. */
function releaseBeforeIdentity(db: mysql.Pool, table: string) {
  const statements = VERSION_2.map((sql) => sql.replaceAll('distributed_locks', table));
  return {
    /** Its migration: every statement. */
    async migrate(): Promise<void> {
      for (const sql of statements) await db.query(sql);
    },
    /** What its backend does on first use: runs its statements unless the holders table's comment is its version. */
    async start(): Promise<void> {
      if ((await comment(db, `${table}_holders`)) !== MYSQL_SCHEMA_VERSION) await this.migrate();
    },
    async acquire(key: string, owner: string, willWait = false): Promise<{ acquired: number; token: number | null }> {
      const [[rows]] = await db.query<mysql.RowDataPacket[][]>(`CALL ${table}_take(?, ?, ?, ?, ?, ?)`, [
        hex(key),
        owner,
        30_000,
        3_000,
        willWait,
        null,
      ]);
      return { acquired: Number(rows[0].acquired), token: rows[0].token === null ? null : Number(rows[0].token) };
    },
    async release(key: string, owner: string): Promise<number> {
      const [[rows]] = await db.query<mysql.RowDataPacket[][]>(`CALL ${table}_release(?, ?)`, [hex(key), owner]);
      return Number(rows[0].released);
    },
  };
}

const holder = { instance: 'web-1', site: 'Orders.pay' };

describe('MySQL lock tables: who holds, next to the release before it', () => {
  it('tables of that release get the columns in place, keep their version, and its leases stay held', async () => {
    const { table, db } = place();
    const old = releaseBeforeIdentity(db, table);
    await old.start();
    const held = await old.acquire('held', 'old-owner');
    expect(held.acquired).toBe(1);
    const b = backend(table);
    expect((await b.tryAcquire(['k'], 'new-owner', 30_000, { holder })).acquired).toBe(true);
    expect(await comment(db, `${table}_holders`)).toBe(MYSQL_SCHEMA_VERSION);
    expect(await comment(db, table)).toBe(MYSQL_KEY_TABLE_COMMENT);
    expect(await b.inspect('held')).toEqual({
      key: 'held',
      owner: 'old-owner',
      ttlMs: expect.any(Number),
      fencingToken: held.token,
      holders: [{ owner: 'old-owner', ttlMs: expect.any(Number), fencingToken: held.token }],
      waiters: [],
    });
    expect((await b.inspect('k'))?.holders?.[0]).toMatchObject({ owner: 'new-owner', ...holder, acquiredAt: expect.any(Number) });
    expect(await b.tryAcquire(['held'], 'new-2', 30_000, { holder, willWait: false })).toMatchObject({ acquired: false });
    expect(await old.release('held', 'old-owner')).toBe(1);
    expect((await b.tryAcquire(['held'], 'new-2', 30_000, { holder })).acquired).toBe(true);
  });

  it('its processes still running, and those that start later, take and release keys in the same line', async () => {
    const { table, db } = place();
    const old = releaseBeforeIdentity(db, table);
    await old.start();
    const b = backend(table);
    expect((await b.tryAcquire(['k'], 'new-owner', 30_000, { holder })).acquired).toBe(true);
    // It waits behind the new holder, unnamed in the line; the release hands it the key.
    expect((await old.acquire('k', 'old-owner', true)).acquired).toBe(0);
    expect((await b.inspect('k'))?.waiters).toEqual([{ owner: 'old-owner', waitingSince: expect.any(Number) }]);
    await b.release(['k'], 'new-owner');
    expect(await b.inspect('k')).toMatchObject({ owner: 'old-owner', holders: [{ owner: 'old-owner', acquiredAt: expect.any(Number) }] });
    expect((await b.inspect('k'))?.holders?.[0].instance).toBeUndefined();
    // And the other way round: a waiter of this release, named, is handed the key by its release.
    expect((await b.tryAcquire(['k'], 'new-waiter', 30_000, { holder })).acquired).toBe(false);
    expect(await old.release('k', 'old-owner')).toBe(1);
    expect((await b.inspect('k'))?.holders).toEqual([
      { owner: 'new-waiter', ...holder, ttlMs: expect.any(Number), fencingToken: expect.any(Number), acquiredAt: expect.any(Number) },
    ]);
    expect(await b.release(['k'], 'new-waiter')).toBe(true);
    // One that starts now finds the version it checks and changes nothing.
    await releaseBeforeIdentity(db, table).start();
    expect((await old.acquire('k', 'old-owner-2')).acquired).toBe(1);
    expect(await b.tryAcquire(['k'], 'new-2', 30_000, { holder, willWait: false })).toMatchObject({ acquired: false });
    expect(await old.release('k', 'old-owner-2')).toBe(1);
    expect((await b.tryAcquire(['k'], 'new-2', 30_000, { holder })).acquired).toBe(true);
  });

  it("its migration run again (a rollback): both releases go on locking; this one's statements run again bring everything back", async () => {
    const { table, db } = place();
    const old = releaseBeforeIdentity(db, table);
    const b = backend(table);
    expect((await b.tryAcquire(['k'], 'new-owner', 30_000, { holder })).acquired).toBe(true);
    await old.migrate();
    expect(await comment(db, `${table}_holders`)).toBe(MYSQL_SCHEMA_VERSION);
    expect((await b.inspect('k'))?.holders?.[0]).toMatchObject({ owner: 'new-owner', ...holder });
    expect((await old.acquire('k', 'old-owner', true)).acquired).toBe(0);
    expect(await b.release(['k'], 'new-owner')).toBe(true);
    expect(await b.inspect('k')).toMatchObject({ owner: 'old-owner' });
    expect((await b.tryAcquire(['k'], 'new-2', 30_000, { holder, willWait: false })).acquired).toBe(false);
    expect(await old.release('k', 'old-owner')).toBe(1);
    expect((await b.tryAcquire(['k'], 'new-2', 30_000, { holder })).acquired).toBe(true);
    expect((await b.inspect('k'))?.holders?.[0]).toMatchObject({ owner: 'new-2', ...holder });
    for (const sql of mysqlLockTablesSql({ table })) await db.query(sql);
    expect((await b.tryAcquire(['k'], 'new-3', 30_000, { holder })).acquired).toBe(false);
    expect(await b.release(['k'], 'new-2')).toBe(true);
    expect((await b.inspect('k'))?.holders?.[0]).toMatchObject({ owner: 'new-3', ...holder });
  });

  it('a migration that stopped part-way (columns added, procedures not yet) is finished on first use', async () => {
    const { table, db } = place();
    await releaseBeforeIdentity(db, table).start();
    const statements = mysqlLockTablesSql({ table });
    const columnsAdded = statements.findIndex((sql) => sql.startsWith('CALL '));
    for (const sql of statements.slice(0, columnsAdded + 1)) await db.query(sql);
    expect((await backend(table).tryAcquire(['k'], 'owner', 30_000, { holder })).acquired).toBe(true);
    expect((await backend(table).inspect('k'))?.holders?.[0]).toMatchObject({ owner: 'owner', ...holder });
  });

  it('with createTables: false, its tables are refused until the migration adds the columns', async () => {
    const { table, db } = place();
    await releaseBeforeIdentity(db, table).start();
    const attempt = backend(table, { createTables: false }).tryAcquire(['k'], 'owner', 30_000);
    await expect(attempt).rejects.toMatchObject({ permanent: true });
    await expect(attempt).rejects.toThrow(
      /is at version 2 with procedures of an earlier release \(not 'nest-distributed-lock procedures, revision 2'\) and createTables is false: run the statements of mysqlLockTablesSql/,
    );
    for (const sql of mysqlLockTablesSql({ table })) await db.query(sql);
    expect((await backend(table, { createTables: false }).tryAcquire(['k'], 'owner', 30_000, { holder })).acquired).toBe(true);
  });
});

describe('MySQL lock procedures dropped by hand', () => {
  it('a procedure dropped under a running backend is made again: the call that met its absence fails, the next one works', async () => {
    const { table, db } = place();
    const locks = backend(table);
    expect(await locks.tryAcquire(['dropped'], 'holder', 60_000)).toMatchObject({ acquired: true });
    await db.query(`DROP PROCEDURE ${table}_release`);
    await expect(locks.release(['dropped'], 'holder')).rejects.toThrow(/PROCEDURE .*_release does not exist/);
    expect(await locks.release(['dropped'], 'holder')).toBe(true);
    expect(await locks.inspect('dropped')).toBeUndefined();
  });

  it('a process started after a procedure was dropped makes it again, or with createTables: false says which are missing', async () => {
    const { table, db } = place();
    expect(await backend(table).tryAcquire(['dropped'], 'holder', 60_000)).toMatchObject({ acquired: true });
    await db.query(`DROP PROCEDURE ${table}_extend`);
    const attempt = backend(table, { createTables: false }).extend(['dropped'], 'holder', 60_000);
    await expect(attempt).rejects.toMatchObject({ permanent: true });
    await expect(attempt).rejects.toThrow(/is at version 2 with procedures missing \(of .*_extend.*\) and createTables is false/);
    expect(await backend(table).extend(['dropped'], 'holder', 60_000)).toEqual({ extended: true });
  });
});
