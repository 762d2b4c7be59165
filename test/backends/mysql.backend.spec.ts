import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import mysql from 'mysql2';
import mysqlPromise from 'mysql2/promise';
import { inspect } from 'node:util';
import { MysqlLockBackend } from '../../lib/backends/mysql/mysql.backend.js';
import { MYSQL_MAX_KEY_BYTES, mysqlLockTablesSql } from '../../lib/backends/mysql/mysql.schema.js';
import { InvalidLockKeyError, InvalidLockOptionsError, LockBackendError } from '../../lib/lock.errors.js';
import { LockService } from '../../lib/lock.service.js';
import { MARIADB_PASSWORD } from '../support/mariadb-server.js';
import { useMariadbServer } from '../support/mariadb-fixture.js';
import { freePort } from '../support/redis-server.js';
import { until } from '../support/wait.js';

const fixture = useMariadbServer();
// Errors that waiting cannot heal fail a caller at once: every call here would wait 10 minutes,
// far past the test's timeout, if the error were retried.
const WAIT = 600_000;
let users = 0;

function backend(connection: string = fixture.url, options?: ConstructorParameters<typeof MysqlLockBackend>[1]): MysqlLockBackend {
  const created = new MysqlLockBackend(connection, options);
  fixture.cleanup(() => created.close());
  return created;
}

function service(connection?: string, options?: ConstructorParameters<typeof MysqlLockBackend>[1]): LockService {
  const locks = new LockService(backend(connection, options), { keyPrefix: '' });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** A user of the test's own with `grants` on the file's database (none by default), dropped after. */
async function user(grants?: string): Promise<string> {
  const name = `app_${++users}`;
  await fixture.admin.query(`CREATE USER '${name}'@'%' IDENTIFIED BY 'right-password'`);
  if (grants) await fixture.admin.query(`GRANT ${grants} ON \`${fixture.database}\`.* TO '${name}'@'%'`);
  fixture.cleanup(() => fixture.admin.query(`DROP USER '${name}'@'%'`));
  return name;
}

function urlAs(name: string, password = 'right-password', database = fixture.database): string {
  const url = new URL(fixture.url);
  url.username = name;
  url.password = password;
  url.pathname = `/${database}`;
  return url.toString();
}

async function refusal(call: Promise<unknown>): Promise<LockBackendError> {
  const error = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(LockBackendError);
  expect((error as LockBackendError).permanent).toBe(true);
  return error as LockBackendError;
}

/** The lock tables, created by the test user, as a deployment's first start or migration would. */
async function tables(): Promise<void> {
  await backend().verify();
}

describe('MysqlLockBackend: keys are bytes', () => {
  it('hostile keys are different locks, each held and freed on its own: quotes, backslashes, NUL, 4-byte UTF-8, case, trailing spaces', async () => {
    const keys = [
      "it's",
      'it"s',
      'a\\b',
      'a\\\\b',
      'nul\u0000x',
      'nul',
      '🔒',
      '🔓',
      'a',
      'A',
      'a ',
      '\u00e4',
      'a\u0308',
      "'); DROP TABLE x; --",
      '%',
      '_',
    ];
    const locks = backend();
    const tokens = new Set<number>();
    for (const [i, key] of keys.entries()) {
      const result = await locks.tryAcquire([key], `owner-${i}`, 60_000);
      expect({ key, result }).toMatchObject({ key, result: { acquired: true } });
      tokens.add((result as { fencingToken: number }).fencingToken);
    }
    expect(tokens.size).toBe(keys.length);
    for (const [i, key] of keys.entries()) expect(await locks.inspect(key)).toMatchObject({ key, owner: `owner-${i}` });
    // Each release frees its own key only.
    expect(await locks.release(['a'], 'owner-8')).toBe(true);
    expect(await locks.inspect('a')).toBeUndefined();
    expect(await locks.inspect('A')).toMatchObject({ owner: 'owner-9' });
    expect(await locks.inspect('a ')).toMatchObject({ owner: 'owner-10' });
    expect(await locks.release(['nul\u0000x'], 'owner-4')).toBe(true);
    expect(await locks.inspect('nul')).toMatchObject({ owner: 'owner-5' });
    // Several of them at once, all-or-nothing.
    expect(await locks.tryAcquire(['a', 'A'], 'other', 60_000)).toMatchObject({ acquired: false });
    expect(await locks.inspect('a')).toBeUndefined();
  });

  it(`takes keys of up to ${MYSQL_MAX_KEY_BYTES} bytes, to hold and to wait for; a longer one is refused before anything is sent`, async () => {
    const locks = backend();
    const longest = '🔒'.repeat(MYSQL_MAX_KEY_BYTES / 4) + 'x'.repeat(MYSQL_MAX_KEY_BYTES % 4);
    expect(Buffer.byteLength(longest)).toBe(MYSQL_MAX_KEY_BYTES);
    const owner = 'o'.repeat(32);
    expect(await locks.tryAcquire([longest], owner, 60_000)).toMatchObject({ acquired: true });
    expect(await locks.tryAcquire([longest], 'w'.repeat(32), 60_000)).toMatchObject({ acquired: false });
    expect(await locks.release([longest], owner)).toBe(true);
    await expect(locks.tryAcquire([`${longest}x`], owner, 60_000)).rejects.toThrow(InvalidLockKeyError);
    await expect(locks.tryAcquire(['k'], 'o'.repeat(33), 60_000)).rejects.toThrow(InvalidLockOptionsError);
  });
});

describe('MysqlLockBackend options', () => {
  it('refuses bad options with a typed error that says what to pass', async () => {
    const ended = mysql.createPool({ uri: fixture.url });
    await new Promise((resolve) => ended.end(resolve));
    const single = await mysqlPromise.createConnection({ uri: fixture.url });
    fixture.cleanup(() => single.end());
    const cases: [() => unknown, string, RegExp][] = [
      [() => new MysqlLockBackend(42 as never), 'connection', /expected a connection, got 42\. Pass a mysql2 pool/],
      [() => new MysqlLockBackend(null as never), 'connection', /got null/],
      [() => new MysqlLockBackend('localhost:3306'), 'connection', /must start with mysql:\/\/ or mariadb:\/\//],
      [() => new MysqlLockBackend('not a url'), 'connection', /'not a url' is not a URL/],
      [() => new MysqlLockBackend('postgres://app:s3cret@db/app'), 'connection', /got 'postgres:\/\/'/],
      [() => new MysqlLockBackend('mysql://app:s3cret@db:3306'), 'connection', /'mysql:\/\/app:\*\*\*@db:3306' names no database/],
      [() => new MysqlLockBackend(single as never), 'connection', /single mysql2 connection.*Pass a pool/],
      [() => new MysqlLockBackend(ended), 'connection', /closed \(end\(\) was called on it\)/],
      [() => new MysqlLockBackend({ host: 'db' }), 'connection', /'database' must name the database/],
      [() => new MysqlLockBackend({ host: 'db', database: 'x', port: 0 }), 'connection', /'port' must be an integer/],
      [() => new MysqlLockBackend(new Map() as never), 'connection', /instance of Map, which is not a mysql2 pool/],
      [() => new MysqlLockBackend(fixture.url, { table: 'Locks' }), 'table', /lower-case letters/],
      [() => new MysqlLockBackend(fixture.url, { table: 'x'.repeat(49) }), 'table', /at most 48/],
      [() => new MysqlLockBackend(fixture.url, { table: 'a`b' }), 'table', /lower-case letters/],
      [() => new MysqlLockBackend(fixture.url, { createTables: 'yes' as never }), 'createTables', /true or false/],
      [() => new MysqlLockBackend(fixture.url, { commandTimeout: -1 }), 'commandTimeout', /positive finite number/],
      [() => new MysqlLockBackend(fixture.url, { waiterTimeout: Infinity }), 'waiterTimeout', /positive finite number/],
      [() => new MysqlLockBackend(fixture.url, { wakeUpInterval: 0 }), 'wakeUpInterval', /positive finite number/],
      [() => new MysqlLockBackend(fixture.url, { tabel: 'x' } as never), 'tabel', /unknown option 'tabel'\. Accepted options: table,/],
      [() => new MysqlLockBackend(fixture.url, 'x' as never), '(options)', /options must be an object/],
      [() => mysqlLockTablesSql({ schema: 'x' } as never), 'schema', /Accepted options: table/],
    ];
    for (const [create, option, message] of cases) {
      let error: unknown;
      try {
        create();
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect({ option: (error as InvalidLockOptionsError).option, message: (error as Error).message }).toEqual({
        option,
        message: expect.stringMatching(message),
      });
      expect((error as Error).message).not.toContain('s3cret');
    }
  });

  it("uses the app's own pool (callback or promise), leaves it open, and shows no password", async () => {
    const pool = mysql.createPool({ uri: fixture.url, connectionLimit: 2 });
    const promisePool = mysqlPromise.createPool({ uri: fixture.url, connectionLimit: 2 });
    fixture.cleanup(() => promisePool.end());
    for (const given of [pool, promisePool]) {
      const locks = new MysqlLockBackend(given as never);
      expect(await locks.tryAcquire(['shared-pool'], 'owner', 5_000)).toMatchObject({ acquired: true });
      expect(await locks.release(['shared-pool'], 'owner')).toBe(true);
      await locks.close();
    }
    // Still open after close.
    await new Promise((resolve, reject) => pool.query('SELECT 1', (error) => (error ? reject(error) : resolve(undefined))));
    await new Promise((resolve) => pool.end(resolve));
    const owned = backend(fixture.url);
    expect(inspect(owned)).toBe("MysqlLockBackend { name: 'mysql', table: 'distributed_locks', waiterTimeout: 3000 }");
    expect(JSON.stringify(owned)).not.toContain(MARIADB_PASSWORD);
  });

  it("creates its tables through the app's pool of one connection", async () => {
    const pool = mysql.createPool({ uri: fixture.url, connectionLimit: 1 });
    fixture.cleanup(() => new Promise((resolve) => pool.end(resolve)));
    const locks = new MysqlLockBackend(pool, { table: 'one_connection_locks', commandTimeout: 10_000 });
    fixture.cleanup(() => locks.close());
    expect(await locks.tryAcquire(['first'], 'owner', 5_000)).toMatchObject({ acquired: true });
    fixture.cleanup(() =>
      fixture.admin.query(
        'DROP TABLE one_connection_locks, one_connection_locks_holders, one_connection_locks_waiters, one_connection_locks_fencing_tokens, one_connection_locks_waiter_places',
      ),
    );
  });

  it('createTables: false with the statements of mysqlLockTablesSql() run as a migration; without them, a permanent error that names it', async () => {
    const missing = service(fixture.url, { table: 'migrated_locks', createTables: false });
    const error = await refusal(missing.acquire('order:1', { wait: WAIT }));
    expect(error.message).toContain("mysqlLockTablesSql({ table: 'migrated_locks' }) in a migration");
    const migration = await mysqlPromise.createConnection(fixture.url);
    fixture.cleanup(() => migration.end());
    // Twice: safe to run again.
    for (let run = 0; run < 2; run++) for (const sql of mysqlLockTablesSql({ table: 'migrated_locks' })) await migration.query(sql);
    await (await missing.acquire('order:1')).release();
    fixture.cleanup(() =>
      fixture.admin.query(
        'DROP TABLE migrated_locks, migrated_locks_holders, migrated_locks_waiters, migrated_locks_fencing_tokens, migrated_locks_waiter_places',
      ),
    );
  });
});

describe('MysqlLockBackend: errors that waiting cannot heal fail at once, naming the fix', () => {
  it('a wrong password: refused at once, and the message does not show it', async () => {
    await tables();
    const name = await user('SELECT, INSERT, UPDATE, DELETE, EXECUTE');
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const locks = service(urlAs(name, 'wrong-password'));
    const error = await refusal(locks.acquire('order:1', { wait: WAIT }));
    expect(error.message).toMatch(/Access denied.*correct the user and password/);
    expect(JSON.stringify([error.message, String(error.cause), warn.mock.calls])).not.toContain('wrong-password');
    await refusal(locks.backend.verify!());
    // The right one works: nothing else was wrong.
    await (await service(urlAs(name)).acquire('order:1')).release();
  });

  it('a user without rights on the database, or with reading rights only: the error names the grants', async () => {
    await tables();
    const none = await user();
    const error = await refusal(service(urlAs(none)).acquire('order:1', { wait: WAIT }));
    expect(error.message).toMatch(/may not use database .*GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON/);
    const reader = await user('SELECT');
    const locks = service(urlAs(reader));
    expect((await refusal(locks.acquire('order:1', { wait: WAIT }))).message).toMatch(/lacks rights on the lock tables.*GRANT/);
    expect((await refusal(locks.backend.verify!())).message).toMatch(/GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE/);
  });

  it('a database that does not exist', async () => {
    const locks = service(fixture.server.adminUrl('no_such_db'));
    const error = await refusal(locks.acquire('order:1', { wait: WAIT }));
    expect(error.message).toMatch(/Unknown database 'no_such_db'.*CREATE DATABASE `no_such_db`/);
  });

  it('a read-only server: verify() and the health check refuse it; locks retry within their wait (a failover ends it)', async () => {
    await tables();
    await fixture.admin.query('SET GLOBAL read_only = 1');
    fixture.cleanup(() => fixture.admin.query('SET GLOBAL read_only = 0'));
    const locks = service();
    expect((await refusal(locks.backend.verify!())).message).toMatch(/read-only.*connect to the primary/);
    expect(await locks.backend.health!()).toEqual({ up: false, details: { readOnly: true }, message: expect.stringMatching(/read-only/) });
    const started = Date.now();
    const waited = await locks.acquire('order:1', { wait: 300 }).catch((e: unknown) => e);
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    expect(waited).toBeInstanceOf(LockBackendError);
    expect(waited).toMatchObject({ permanent: false, message: expect.stringMatching(/read-only.*retried within the wait/) });
    // Writable again: the next call works.
    await fixture.admin.query('SET GLOBAL read_only = 0');
    expect(await locks.backend.health!()).toEqual({ up: true, details: { readOnly: false } });
    await (await locks.acquire('order:1')).release();
  });

  it('verify() resolves when the server cannot be reached, and for a user that may use the tables', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const away = backend(`mysql://locks:x@127.0.0.1:${await freePort()}/db`, { commandTimeout: 1_000 });
    await expect(away.verify()).resolves.toBeUndefined();
    await expect(backend().verify()).resolves.toBeUndefined();
    const [rows] = await fixture.admin.query<mysqlPromise.RowDataPacket[]>(
      'SELECT lock_key FROM distributed_locks_holders UNION ALL SELECT lock_key FROM distributed_locks_waiters',
    );
    expect(rows).toEqual([]);
  });
});

describe('MysqlLockBackend: the line and the row locks', () => {
  it('a release hands the lock to the first waiter; a newcomer asking right after it does not jump the line', async () => {
    const [holder, first, second, newcomer] = [backend(), backend(), backend(), backend()];
    expect(await holder.tryAcquire(['line'], 'holder', 60_000)).toMatchObject({ acquired: true });
    expect(await first.tryAcquire(['line'], 'first', 60_000)).toMatchObject({ acquired: false });
    expect(await second.tryAcquire(['line'], 'second', 60_000)).toMatchObject({ acquired: false });
    expect(await holder.release(['line'], 'holder')).toBe(true);
    // Handed over in the release's own transaction.
    expect(await newcomer.inspect('line')).toMatchObject({ owner: 'first' });
    expect(await newcomer.tryAcquire(['line'], 'newcomer', 60_000, { willWait: false })).toMatchObject({ acquired: false });
    expect(await second.tryAcquire(['line'], 'second', 60_000)).toMatchObject({ acquired: false });
    // The waiter's process finds its turn, and enters with a greater token.
    let woken = false;
    const stop = await first.watch(['line'], () => (woken = true), 'first');
    await until(() => woken, 5_000, 'the first waiter to be woken');
    stop();
    expect(await first.tryAcquire(['line'], 'first', 60_000)).toMatchObject({ acquired: true });
    expect(await first.release(['line'], 'first')).toBe(true);
    expect(await newcomer.tryAcquire(['line'], 'newcomer', 60_000)).toMatchObject({ acquired: false });
    expect(await newcomer.inspect('line')).toMatchObject({ owner: 'second' });
  });

  it('a lease that runs out goes to the first in line: a newcomer does not jump the line, and nor does the second', async () => {
    const locks = backend(fixture.url, { waiterTimeout: 60_000 });
    expect(await locks.tryAcquire(['expiring'], 'holder', 200)).toMatchObject({ acquired: true });
    expect(await locks.tryAcquire(['expiring'], 'first', 60_000)).toMatchObject({ acquired: false });
    expect(await locks.tryAcquire(['expiring'], 'second', 60_000)).toMatchObject({ acquired: false });
    await until(async () => (await locks.inspect('expiring')) === undefined, 5_000, 'the lease to run out');
    expect(await locks.tryAcquire(['expiring'], 'newcomer', 60_000, { willWait: false })).toMatchObject({ acquired: false });
    expect(await locks.tryAcquire(['expiring'], 'second', 60_000)).toMatchObject({ acquired: false });
    expect(await locks.tryAcquire(['expiring'], 'first', 60_000)).toMatchObject({ acquired: true });
  });

  it('a waiter that stops asking loses its place after waiterTimeout, and the next one gets the key', async () => {
    const locks = backend(fixture.url, { waiterTimeout: 200 });
    expect(await locks.tryAcquire(['gone'], 'holder', 60_000)).toMatchObject({ acquired: true });
    expect(await locks.tryAcquire(['gone'], 'dead-waiter', 60_000)).toMatchObject({ acquired: false });
    await until(
      async () => {
        const [rows] = await fixture.admin.query<mysqlPromise.RowDataPacket[]>(
          'SELECT deadline < UTC_TIMESTAMP(6) AS gone FROM distributed_locks_waiters',
        );
        return Number(rows[0]?.gone) === 1;
      },
      5_000,
      "the dead waiter's place to run out",
    );
    expect(await locks.release(['gone'], 'holder')).toBe(true);
    expect(await locks.tryAcquire(['gone'], 'next', 60_000)).toMatchObject({ acquired: true });
  });

  it('two keys never wait for each other: a transaction holding one key row holds nothing else', async () => {
    const locks = backend(fixture.url, { commandTimeout: 30_000 });
    /** Transactions waiting for a row lock now. */
    const lockWaits = async () => {
      const [rows] = await fixture.admin.query<mysqlPromise.RowDataPacket[]>(
        "SELECT COUNT(*) AS n FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'",
      );
      return Number(rows[0].n);
    };
    await locks.verify();
    const hex = (key: string) => Buffer.from(key).toString('hex');
    const holder = await mysqlPromise.createConnection(fixture.url);
    fixture.cleanup(() => holder.end());
    // A key locked before: its row is there, free.
    expect(await locks.tryAcquire(['row:1'], 'earlier', 60_000)).toMatchObject({ acquired: true });
    expect(await locks.release(['row:1'], 'earlier')).toBe(true);
    // What every procedure does first: lock its key's row. Its neighbours are new keys.
    await holder.query('SET TRANSACTION ISOLATION LEVEL READ COMMITTED');
    await holder.query('START TRANSACTION');
    await holder.query('CALL distributed_locks_lock_keys(?, @now)', [hex('row:1')]);
    const [[trx]] = await fixture.admin.query<mysqlPromise.RowDataPacket[]>(
      'SELECT trx_rows_locked FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?',
      [holder.threadId],
    );
    expect(Number(trx.trx_rows_locked)).toBe(1);
    for (const key of ['row:0', 'row:2', 'row:10']) {
      expect(await locks.tryAcquire([key], 'other', 60_000)).toMatchObject({ acquired: true });
      expect(await locks.extend([key], 'other', 60_000)).toEqual({ extended: true });
      expect(await locks.tryAcquire([key], 'waiter', 60_000)).toMatchObject({ acquired: false });
      expect(await locks.release([key], 'other')).toBe(true);
    }
    expect(await lockWaits()).toBe(0);
    // The key itself is locked: a call on it waits until the holder's transaction ends.
    let answered = false;
    const blocked = locks.tryAcquire(['row:1'], 'other', 60_000).finally(() => (answered = true));
    // Calls on other keys, sent after it, are answered while it waits.
    const other = backend();
    for (const key of ['row:5', 'row:6']) expect(await other.tryAcquire([key], 'third', 60_000)).toMatchObject({ acquired: true });
    expect(answered).toBe(false);
    await holder.query('ROLLBACK');
    expect(await blocked).toMatchObject({ acquired: true });
  });

  it('a lock wait timeout (1205) or deadlock InnoDB reports is sent again within the wait, not reported as a failure', async () => {
    // For the connections opened from now on.
    await fixture.admin.query('SET GLOBAL innodb_lock_wait_timeout = 1');
    fixture.cleanup(() => fixture.admin.query('SET GLOBAL innodb_lock_wait_timeout = 50'));
    const locks = backend(fixture.url, { commandTimeout: 10_000 });
    await locks.verify();
    const holder = await mysqlPromise.createConnection(fixture.url);
    fixture.cleanup(() => holder.end());
    await holder.query('START TRANSACTION');
    await holder.query('CALL distributed_locks_lock_keys(?, @now)', [Buffer.from('stuck').toString('hex')]);
    const lockWaits = async () => {
      const [rows] = await fixture.admin.query<mysqlPromise.RowDataPacket[]>("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'");
      return Number(rows[0].Value);
    };
    const before = await lockWaits();
    const acquired = locks.tryAcquire(['stuck'], 'owner', 60_000);
    // Held past two lock wait timeouts of the call.
    const seen = await until(async () => (await lockWaits()) >= before + 3, 8_000, 'two lock wait timeouts and a third wait').then(
      () => true,
    );
    await holder.query('ROLLBACK');
    expect(seen).toBe(true);
    expect(await acquired).toMatchObject({ acquired: true });
  });
});
