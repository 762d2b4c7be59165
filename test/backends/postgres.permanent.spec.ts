import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { LockBackendError, LockService, PostgresLockBackend } from '../../lib/index.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { freePort } from '../support/redis-server.js';

// Errors that waiting cannot heal fail a caller at once, however long it would wait: every call
// here waits 10 minutes, far past the test's timeout, if the error were retried.
const fixture = usePostgresServer();
const WAIT = 600_000;
let roles = 0;

/** A login role of the test's own (trusted, unless a test asks for its password), dropped after. */
async function role(setup: (name: string) => string[] = () => []): Promise<string> {
  const name = `app_${process.pid}_${++roles}`;
  await fixture.admin.query(`CREATE ROLE ${name} LOGIN PASSWORD 'right-password'`);
  for (const statement of setup(name)) await fixture.admin.query(statement);
  fixture.cleanup(async () => {
    await fixture.admin.query(`DROP OWNED BY ${name}`);
    await fixture.admin.query(`DROP ROLE ${name}`);
  });
  return name;
}

/** The file's database as `name`. */
function urlAs(name: string, password?: string, database?: string): string {
  const url = new URL(fixture.url);
  url.username = name;
  if (password !== undefined) url.password = password;
  if (database !== undefined) url.pathname = `/${database}`;
  return url.toString();
}

function service(connection: string, options?: ConstructorParameters<typeof PostgresLockBackend>[1]): LockService {
  const locks = new LockService(new PostgresLockBackend(connection, options), { keyPrefix: '' });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** The tables, created by the superuser, as a deployment's migration would. */
async function tables(): Promise<void> {
  const owner = new PostgresLockBackend(fixture.url);
  await owner.inspect('any');
  await owner.close();
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

describe('PostgreSQL backend: errors that waiting cannot heal fail at once, naming the fix', () => {
  it('a read-only role: the acquire, verify() and the health check say so', async () => {
    await tables();
    const name = await role((n) => [
      `GRANT SELECT, INSERT, UPDATE, DELETE ON distributed_locks, distributed_locks_waiters TO ${n}`,
      `GRANT USAGE, SELECT ON SEQUENCE distributed_locks_fencing_tokens, distributed_locks_waiter_places TO ${n}`,
      `ALTER ROLE ${n} SET default_transaction_read_only = on`,
    ]);
    const locks = service(urlAs(name));
    const error = await refusal(locks.acquire('order:1', { wait: WAIT }));
    expect(error.message).toMatch(/read-only transaction.*ALTER ROLE app_\d+_\d+ SET default_transaction_read_only = off/);
    expect((await refusal(locks.backend.verify!())).message).toMatch(/read-only/);
    expect(await locks.backend.health!()).toEqual({
      up: false,
      details: { inRecovery: false, readOnly: true },
      message: expect.stringMatching(/read-only/),
    });
  });

  it('a role without rights on the lock tables: the error names the grants', async () => {
    await tables();
    const name = await role();
    const locks = service(urlAs(name));
    const error = await refusal(locks.acquire('order:1', { wait: WAIT }));
    expect(error.message).toMatch(/permission denied.*GRANT SELECT, INSERT, UPDATE, DELETE ON "public"."distributed_locks"/);
    expect((await refusal(locks.backend.verify!())).message).toMatch(/GRANT/);
  });

  it("verify(): a role without USAGE on the waiters' sequence is refused (every wait would fail), naming the grants", async () => {
    await tables();
    const name = await role((n) => [
      `GRANT SELECT, INSERT, UPDATE, DELETE ON distributed_locks, distributed_locks_waiters TO ${n}`,
      `GRANT USAGE, SELECT ON SEQUENCE distributed_locks_fencing_tokens TO ${n}`,
    ]);
    const locks = service(urlAs(name));
    expect((await refusal(locks.backend.verify!())).message).toMatch(/GRANT USAGE, SELECT ON SEQUENCE .*distributed_locks_waiter_places/);
  });

  it('a database that does not exist', async () => {
    const locks = service(urlAs('postgres', undefined, 'no_such_db'));
    const error = await refusal(locks.acquire('order:1', { wait: WAIT }));
    expect(error.message).toMatch(/database "no_such_db" does not exist.*CREATE DATABASE no_such_db/);
    await refusal(locks.backend.verify!());
  });

  it('a wrong password: refused at once, and the message does not show it', async () => {
    await tables();
    const name = await role((n) => [
      `GRANT SELECT, INSERT, UPDATE, DELETE ON distributed_locks, distributed_locks_waiters TO ${n}`,
      `GRANT USAGE, SELECT ON SEQUENCE distributed_locks_fencing_tokens, distributed_locks_waiter_places TO ${n}`,
    ]);
    await fixture.server.requirePassword(name);
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    fixture.cleanup(() => warn.mockRestore());
    const locks = service(urlAs(name, 'wrong-password'));
    const error = await refusal(locks.acquire('order:1', { wait: WAIT }));
    expect(error.message).toMatch(/password authentication failed.*correct the user and password/);
    expect(JSON.stringify([error.message, String(error.cause), warn.mock.calls])).not.toContain('wrong-password');
    await refusal(locks.backend.verify!());
    // The right one works: nothing else was wrong.
    await (await service(urlAs(name, 'right-password')).acquire('order:1')).release();
  });

  it('verify() resolves when PostgreSQL cannot be reached: locks fail until it is back', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const backend = new PostgresLockBackend(`postgres://postgres@127.0.0.1:${await freePort()}/db`, { commandTimeout: 1_000 });
    fixture.cleanup(() => backend.close());
    await expect(backend.verify()).resolves.toBeUndefined();
  });

  it('verify() resolves for a role that may use the tables, and leaves nothing behind', async () => {
    const backend = new PostgresLockBackend(fixture.url);
    fixture.cleanup(() => backend.close());
    await expect(backend.verify()).resolves.toBeUndefined();
    expect(await backend.health()).toEqual({ up: true, details: { inRecovery: false, readOnly: false } });
    const { rows } = await fixture.admin.query('SELECT key FROM distributed_locks UNION ALL SELECT key FROM distributed_locks_waiters');
    expect(rows).toEqual([]);
  });
});

describe('PostgreSQL backend: creating its tables without the right to', () => {
  it('a schema that does not exist: the error says to create it for the role, and once that is run, locks work', async () => {
    const name = await role();
    await fixture.admin.query(`REVOKE CREATE ON DATABASE ${new URL(fixture.url).pathname.slice(1)} FROM PUBLIC`);
    const locks = service(urlAs(name), { schema: 'advlocks' });
    const error = await refusal(locks.acquire('order:1', { wait: WAIT }));
    expect(error.message).toContain(`Schema advlocks does not exist and role ${name} may not create it`);
    expect(error.message).toContain(`CREATE SCHEMA advlocks AUTHORIZATION ${name};`);
    expect(error.message).toContain(`postgresLockTablesSql({ schema: 'advlocks', table: 'distributed_locks' })`);
    await refusal(locks.backend.verify!());

    await fixture.admin.query(`CREATE SCHEMA advlocks AUTHORIZATION ${name}`);
    fixture.cleanup(() => fixture.admin.query('DROP SCHEMA IF EXISTS advlocks CASCADE'));
    await (await locks.acquire('order:1')).release();
  });

  it('a schema that exists: the error says what to grant', async () => {
    const name = await role();
    await fixture.admin.query('CREATE SCHEMA theirs');
    fixture.cleanup(() => fixture.admin.query('DROP SCHEMA theirs CASCADE'));
    await fixture.admin.query(`GRANT USAGE ON SCHEMA theirs TO ${name}`);
    const locks = service(urlAs(name), { schema: 'theirs' });
    const error = await refusal(locks.acquire('order:1', { wait: WAIT }));
    expect(error.message).toContain(`GRANT CREATE ON SCHEMA theirs TO ${name};`);
  });
});
