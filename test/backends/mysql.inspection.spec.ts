import { describe, expect, it } from '@jest/globals';
import mysql from 'mysql2';
import { MAX_IDENTITY_LENGTH } from '../../lib/backends/lock-backend.interface.js';
import { MysqlLockBackend } from '../../lib/backends/mysql/mysql.backend.js';
import { InvalidLockOptionsError } from '../../lib/lock.errors.js';
import { useMariadbServer } from '../support/mariadb-fixture.js';
import { until } from '../support/wait.js';

/**
 * Who holds and waits on MySQL, where the conformance suite cannot see it: a hand-over made by a
 * release (the waiter's process has not asked again yet), a waiter asking again, the server's
 * session time zone, an identity too long for its column.
 */
const fixture = useMariadbServer();

function backend(connection: ConstructorParameters<typeof MysqlLockBackend>[0] = fixture.url): MysqlLockBackend {
  const created = new MysqlLockBackend(connection, { waiterTimeout: 60_000 });
  fixture.cleanup(() => created.close());
  return created;
}

const a = { instance: 'web-1', site: 'Orders.pay' };
const b = { instance: 'web-2', site: 'Refunds.issue' };
const c = { instance: 'worker-3' };

describe('MySQL: who holds and waits', () => {
  it("a release hands the key to the first waiter with that waiter's identity, before its process asks again", async () => {
    const one = backend();
    const two = backend();
    expect((await one.tryAcquire(['k'], 'owner-a', 30_000, { holder: a })).acquired).toBe(true);
    expect((await two.tryAcquire(['k'], 'owner-b', 30_000, { holder: b })).acquired).toBe(false);
    expect((await two.tryAcquire(['k'], 'owner-c', 30_000, { holder: c })).acquired).toBe(false);
    const line = (await one.inspect('k'))!.waiters!;
    expect(line).toEqual([
      { owner: 'owner-b', ...b, waitingSince: expect.any(Number) },
      { owner: 'owner-c', ...c, waitingSince: expect.any(Number) },
    ]);
    const handedAfter = Date.now();
    // The release hands it over in its own transaction; owner-b's process has not looked yet.
    await one.release(['k'], 'owner-a');
    const state = (await one.inspect('k'))!;
    expect(state.holders).toEqual([
      { owner: 'owner-b', ...b, ttlMs: expect.any(Number), fencingToken: expect.any(Number), acquiredAt: expect.any(Number) },
    ]);
    expect(state.holders![0].acquiredAt).toBeGreaterThanOrEqual(handedAfter - 1_000);
    expect(state.holders![0].acquiredAt).toBeGreaterThan(line[0].waitingSince!);
    expect(state.waiters).toEqual([{ owner: 'owner-c', ...c, waitingSince: line[1].waitingSince }]);
    // Its own attempt then finds the key its own: taken as it is, when it was handed over.
    expect((await two.tryAcquire(['k'], 'owner-b', 30_000, { holder: b })).acquired).toBe(true);
    expect((await one.inspect('k'))!.holders![0].acquiredAt).toBe(state.holders![0].acquiredAt);
  });

  it('a waiter that asks again keeps its place and its waiting-since; one whose place ran out gets a new one', async () => {
    const one = backend();
    const short = new MysqlLockBackend(fixture.url, { waiterTimeout: 1_000 });
    fixture.cleanup(() => short.close());
    expect((await one.tryAcquire(['k'], 'owner-a', 30_000, { holder: a })).acquired).toBe(true);
    expect((await one.tryAcquire(['k'], 'owner-b', 30_000, { holder: b })).acquired).toBe(false);
    const since = (await one.inspect('k'))!.waiters![0].waitingSince!;
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect((await one.tryAcquire(['k'], 'owner-b', 30_000, { holder: b })).acquired).toBe(false);
    expect((await one.inspect('k'))!.waiters).toEqual([{ owner: 'owner-b', ...b, waitingSince: since }]);

    expect((await short.tryAcquire(['k'], 'owner-c', 30_000, { holder: c })).acquired).toBe(false);
    const first = (await one.inspect('k'))!.waiters![1].waitingSince!;
    // Its place lasts a second without asking: gone from the line, then back at its end, anew.
    await until(async () => (await one.inspect('k'))!.waiters!.length === 1, 10_000, "owner-c's place to run out");
    expect((await one.inspect('k'))!.waiters!.map((w) => w.owner)).toEqual(['owner-b']);
    expect((await short.tryAcquire(['k'], 'owner-c', 30_000, { holder: c })).acquired).toBe(false);
    expect((await one.inspect('k'))!.waiters![1].waitingSince).toBeGreaterThan(first);
  });

  it("tells times since the epoch whatever the session's time zone", async () => {
    // Every connection of this pool reads and writes DATETIMEs in UTC+5.
    const pool = mysql.createPool({ uri: fixture.url, connectionLimit: 2 });
    pool.on('connection', (connection) => connection.query("SET time_zone = '+05:00'"));
    fixture.cleanup(() => new Promise((resolve) => pool.end(resolve)));
    const zoned = backend(pool);
    const before = Date.now();
    expect((await zoned.tryAcquire(['k'], 'owner-a', 30_000, { holder: a })).acquired).toBe(true);
    expect((await zoned.tryAcquire(['k'], 'owner-b', 30_000, { holder: b })).acquired).toBe(false);
    const after = Date.now();
    const state = (await zoned.inspect('k'))!;
    for (const at of [state.holders![0].acquiredAt!, state.waiters![0].waitingSince!]) {
      expect(at).toBeGreaterThanOrEqual(before - 1_000);
      expect(at).toBeLessThanOrEqual(after + 1_000);
    }
  });

  it('stores names of the longest length in any characters; a caller of the backend that passes longer ones is refused', async () => {
    const one = backend();
    // 3 bytes of UTF-8 each, the most a UTF-16 unit takes: 769 bytes in all (a pair of units, as 😀, takes 4).
    const longest = { instance: '€'.repeat(MAX_IDENTITY_LENGTH), site: '€'.repeat(MAX_IDENTITY_LENGTH - 2) + '😀' };
    expect((await one.tryAcquire(['k'], 'owner-a', 30_000, { holder: longest })).acquired).toBe(true);
    expect((await one.inspect('k'))!.holders![0]).toMatchObject(longest);
    const tooLong = { instance: '€'.repeat(MAX_IDENTITY_LENGTH * 2), site: 'x' };
    await expect(one.tryAcquire(['other'], 'owner-b', 30_000, { holder: tooLong })).rejects.toThrow(InvalidLockOptionsError);
    await expect(one.tryAcquire(['other'], 'owner-b', 30_000, { holder: tooLong })).rejects.toThrow(
      /mysql backend stores an identity \(instance and site\) of at most 769 bytes, got 770: give names of at most 128 characters/,
    );
    expect(await one.inspect('other')).toBeUndefined();
  });
});
