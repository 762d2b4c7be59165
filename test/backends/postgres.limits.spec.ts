import { describe, expect, it } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import { InvalidLockKeyError, InvalidLockOptionsError, LockBackendError, LockService, PostgresLockBackend } from '../../lib/index.js';
import { POSTGRES_MAX_KEY_BYTES } from '../../lib/backends/postgres/postgres.backend.js';
import { SCHEMA_VERSION } from '../../lib/backends/postgres/postgres.schema.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { until } from '../support/wait.js';

const fixture = usePostgresServer();

function service(): LockService {
  const locks = new LockService(new PostgresLockBackend(fixture.url), { keyPrefix: '', maxKeyLength: 10_000 });
  fixture.cleanup(() => locks.onApplicationShutdown());
  return locks;
}

/** The token sequence's next value is `next`, as after an operator's ALTER SEQUENCE. */
async function tokensFrom(next: number | string): Promise<void> {
  await fixture.admin.query(`ALTER SEQUENCE distributed_locks_fencing_tokens RESTART WITH ${next}`);
  fixture.cleanup(() => fixture.admin.query('ALTER SEQUENCE distributed_locks_fencing_tokens RESTART WITH 1'));
}

async function waiting(): Promise<void> {
  await until(async () => (await fixture.admin.query('SELECT count(*)::int AS n FROM distributed_locks_waiters')).rows[0].n > 0, 10_000);
}

describe('PostgreSQL backend: fencing tokens up to the last exact one', () => {
  it('tokens are exact up to Number.MAX_SAFE_INTEGER, then every acquire fails at once with an error that names the fix', async () => {
    const locks = service();
    await (await locks.acquire('start')).release(); // creates the tables
    await tokensFrom(Number.MAX_SAFE_INTEGER - 2);
    const tokens: number[] = [];
    for (let i = 0; i < 3; i++) {
      const handle = await locks.acquire('order:1');
      tokens.push(handle.fencingToken!);
      await handle.release();
    }
    expect(tokens).toEqual([Number.MAX_SAFE_INTEGER - 2, Number.MAX_SAFE_INTEGER - 1, Number.MAX_SAFE_INTEGER]);
    const error = await locks.acquire('order:1', { wait: 600_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as LockBackendError).permanent).toBe(true);
    expect((error as LockBackendError).message).toMatch(/reached its maximum, 9007199254740991.*new table \(option 'table'\)/);
  });

  it('a release at the limit still frees the key: the waiter it would hand the lock to fails at once, nobody holds the key', async () => {
    const [holder, waiter] = [service(), service()];
    await (await holder.acquire('start')).release();
    await tokensFrom(Number.MAX_SAFE_INTEGER);
    const held = await holder.acquire('order:2', { ttl: 60_000 });
    expect(held.fencingToken).toBe(Number.MAX_SAFE_INTEGER);
    const waited = waiter.acquire('order:2', { wait: 600_000 }).catch((e: unknown) => e);
    await waiting();
    await held.release();
    expect(held.isHeld).toBe(false);
    expect(await holder.inspect('order:2')).toBeUndefined();
    const error = await waited;
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as LockBackendError).permanent).toBe(true);
  });
});

describe('PostgreSQL backend: a token sequence already past the last exact token', () => {
  it('the lock tables of an older version cannot be brought up to date: refused at once, with the fix', async () => {
    await (await service().acquire('start')).release(); // creates the tables
    // As an operator's setval on the tables of a version whose sequence had no maximum.
    await fixture.admin.query('ALTER SEQUENCE distributed_locks_fencing_tokens NO MAXVALUE');
    await fixture.admin.query(`SELECT setval('distributed_locks_fencing_tokens', ${Number.MAX_SAFE_INTEGER} + 10)`);
    await fixture.admin.query(`COMMENT ON TABLE distributed_locks IS 'nest-distributed-lock lock table, version 2'`);
    fixture.cleanup(async () => {
      await fixture.admin.query('ALTER SEQUENCE distributed_locks_fencing_tokens RESTART WITH 1');
      await fixture.admin.query(`ALTER SEQUENCE distributed_locks_fencing_tokens MAXVALUE ${Number.MAX_SAFE_INTEGER}`);
      await fixture.admin.query(`COMMENT ON TABLE distributed_locks IS '${SCHEMA_VERSION}'`);
    });
    const error = await service()
      .acquire('order:1', { wait: 600_000 })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LockBackendError);
    expect((error as LockBackendError).permanent).toBe(true);
    expect((error as LockBackendError).message).toMatch(/past 9007199254740991.*option 'table'/);
  });
});

describe('PostgreSQL backend: keys as long as it can index', () => {
  /** A key of `bytes` ASCII characters that does not compress, as a hash or a payload would not. */
  const longKey = (bytes: number) => randomBytes(bytes).toString('base64url').slice(0, bytes);

  it(`a key of ${POSTGRES_MAX_KEY_BYTES} bytes is taken, waited for and handed over`, async () => {
    const [holder, waiter] = [service(), service()];
    const key = longKey(POSTGRES_MAX_KEY_BYTES);
    const held = await holder.acquire(key, { ttl: 60_000 });
    const next = waiter.acquire(key, { wait: 30_000 });
    await waiting();
    await held.release();
    const handle = await next;
    expect(handle.fencingToken).toBeGreaterThan(held.fencingToken!);
    await handle.release();
  });

  it('the bound is on the key alone: a shorter owner does not let a longer key in, which its waiters could not wait for', async () => {
    const backend = new PostgresLockBackend(fixture.url);
    fixture.cleanup(() => backend.close());
    const key = longKey(POSTGRES_MAX_KEY_BYTES + 1);
    await expect(backend.tryAcquire([key], 'a', 60_000)).rejects.toBeInstanceOf(InvalidLockKeyError);
    await expect(backend.tryAcquire(['order:1'], 'o'.repeat(33), 60_000)).rejects.toBeInstanceOf(InvalidLockOptionsError);
  });

  it('a longer key is refused up front with InvalidLockKeyError, free or not, and leaves nothing behind', async () => {
    const [holder, waiter] = [service(), service()];
    const key = longKey(POSTGRES_MAX_KEY_BYTES + 1);
    for (const locks of [holder, waiter]) {
      const error = await locks.acquire(key, { wait: 600_000 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockKeyError);
      expect((error as Error).message).toMatch(
        new RegExp(`is ${POSTGRES_MAX_KEY_BYTES + 1} bytes long in UTF-8, over the ${POSTGRES_MAX_KEY_BYTES}`),
      );
    }
    // Four bytes a character: the bound is in bytes.
    const wide = '🔒'.repeat(Math.floor(POSTGRES_MAX_KEY_BYTES / 4) + 1);
    await expect(holder.tryAcquire(wide)).rejects.toBeInstanceOf(InvalidLockKeyError);
    const { rows } = await fixture.admin.query('SELECT key FROM distributed_locks UNION ALL SELECT key FROM distributed_locks_waiters');
    expect(rows).toEqual([]);
  });
});
