import { describe, expect, it, jest } from '@jest/globals';
import type { LockBackend } from '../../lib/backends/lock-backend.interface.js';
import { MysqlLockBackend } from '../../lib/backends/mysql/mysql.backend.js';
import { PostgresLockBackend } from '../../lib/backends/postgres/postgres.backend.js';
import { RedisLockBackend } from '../../lib/backends/redis/redis.backend.js';
import { useMariadbServer } from '../support/mariadb-fixture.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

/**
 * A waiter for several keys whose place runs out (its process paused past waiterTimeout)
 * while it stands in the lines of its first keys. Others pass it; when it asks again the first key
 * keeps it out, so it must take a place at the back of that line (behind whoever came meanwhile,
 * not its old one) and leave the later line, where the single-key waiter it kept out enters the
 * free key. Tokens of each key only rise. On the backend itself, deterministic.
 */
jest.setTimeout(60_000);
const waiterTimeout = 400;

/** The token an attempt won (NaN if it won none: every comparison with it fails). */
const tokenOf = (result: Awaited<ReturnType<LockBackend['tryAcquire']>>): number => (result.acquired ? (result.fencingToken ?? NaN) : NaN);

async function scenario(make: () => LockBackend, lineOf: (key: string) => Promise<string[]>): Promise<void> {
  const [h, w, z, y, q] = [make(), make(), make(), make(), make()];
  // Connected first: the scenario's steps must each come well within a place's time.
  for (const [i, b] of [h, w, z, y, q].entries()) {
    expect((await b.tryAcquire([`warm-${i}`], `warm-${i}`, 1_000)).acquired).toBe(true);
    await b.release([`warm-${i}`], `warm-${i}`);
  }
  // b is held; the caller of [a, b] finds a free and b held: it stands in both lines.
  const hb = await h.tryAcquire(['b'], 'h', 60_000);
  expect(hb.acquired).toBe(true);
  expect((await w.tryAcquire(['a', 'b'], 'w', 60_000)).acquired).toBe(false);
  expect(await lineOf('a')).toEqual(['w']);
  // A single-key waiter for b stands behind it.
  expect((await y.tryAcquire(['b'], 'y', 60_000)).acquired).toBe(false);
  expect(await lineOf('b')).toEqual(['w', 'y']);
  // The caller of both pauses past its place; another takes a (its place passed) and holds it.
  await new Promise((resolve) => setTimeout(resolve, waiterTimeout + 150));
  const za = await z.tryAcquire(['a'], 'z', 60_000);
  expect(za.acquired).toBe(true);
  // b is released: y, not the caller of both whose place ran out, is next.
  expect(await h.release(['b'], 'h')).toBe(true);
  await until(async () => (await y.tryAcquire(['b'], 'y', 60_000)).acquired, 3_000, 'y to get b');
  const yb = await y.tryAcquire(['b'], 'y', 60_000);
  expect(tokenOf(yb)).toBeGreaterThan(tokenOf(hb));
  // Another waits for a meanwhile.
  expect((await q.tryAcquire(['a'], 'q', 60_000)).acquired).toBe(false);
  // The caller of both asks again: a keeps it out; it stands in a only, behind the one who came
  // while its place had run out.
  const again = await w.tryAcquire(['a', 'b'], 'w', 60_000);
  expect(again.acquired).toBe(false);
  expect(await lineOf('a')).toEqual(['q', 'w']);
  expect(await lineOf('b')).toEqual([]);
  // z leaves a (to q, who leaves it): the caller of both takes both once y leaves b; tokens above
  // every earlier one.
  await z.release(['a'], 'z');
  await until(async () => (await q.tryAcquire(['a'], 'q', 60_000)).acquired, 3_000, 'q to get a');
  await q.release(['a'], 'q');
  await y.release(['b'], 'y');
  await until(async () => (await w.tryAcquire(['a', 'b'], 'w', 60_000)).acquired, 3_000, 'w to get both');
  const both = await w.tryAcquire(['a', 'b'], 'w', 60_000);
  expect(tokenOf(both)).toBeGreaterThan(Math.max(tokenOf(za), tokenOf(yb)));
  await w.release(['a', 'b'], 'w');
}

/** Held a: the caller of [a, b] waits in a; its place runs out; q comes; it asks again and stands behind q. */
async function behindWhoCameMeanwhile(make: () => LockBackend, lineOf: (key: string) => Promise<string[]>): Promise<void> {
  const [x, w, q] = [make(), make(), make()];
  for (const [i, b] of [x, w, q].entries()) {
    expect((await b.tryAcquire([`warm-${i}`], `warm-${i}`, 1_000)).acquired).toBe(true);
    await b.release([`warm-${i}`], `warm-${i}`);
  }
  expect((await x.tryAcquire(['a'], 'x', 60_000)).acquired).toBe(true);
  expect((await w.tryAcquire(['a', 'b'], 'w', 60_000)).acquired).toBe(false);
  expect(await lineOf('a')).toEqual(['w']);
  await new Promise((resolve) => setTimeout(resolve, waiterTimeout + 150));
  expect((await q.tryAcquire(['a'], 'q', 60_000)).acquired).toBe(false);
  expect((await w.tryAcquire(['a', 'b'], 'w', 60_000)).acquired).toBe(false);
  expect(await lineOf('a')).toEqual(['q', 'w']);
  expect(await lineOf('b')).toEqual([]);
}

describe('a multi-key waiter whose place ran out while it stood in its first lines', () => {
  describe('PostgreSQL', () => {
    const fixture = usePostgresServer();
    it('takes a new place at the back of the line that keeps it out, and leaves the later one', async () => {
      const make = () => {
        const b = new PostgresLockBackend(fixture.url, { waiterTimeout });
        fixture.cleanup(() => b.close());
        return b;
      };
      const lineOf = async (key: string) =>
        (
          await fixture.admin.query<{ owner: string }>(
            'SELECT owner FROM distributed_locks_waiters WHERE key = $1 AND deadline > clock_timestamp() ORDER BY place',
            [key],
          )
        ).rows.map((r) => r.owner);
      await scenario(make, lineOf);
      await behindWhoCameMeanwhile(make, lineOf);
    });
  });

  describe('MySQL (MariaDB)', () => {
    const fixture = useMariadbServer();
    it('takes a new place at the back of the line that keeps it out, and leaves the later one', async () => {
      const make = () => {
        const b = new MysqlLockBackend(fixture.url, { waiterTimeout });
        fixture.cleanup(() => b.close());
        return b;
      };
      const lineOf = async (key: string) =>
        (
          (
            await fixture.admin.query(
              'SELECT owner FROM distributed_locks_waiters WHERE lock_key = ? AND deadline > UTC_TIMESTAMP(6) ORDER BY place',
              [key],
            )
          )[0] as {
            owner: Buffer;
          }[]
        ).map((r) => r.owner.toString());
      await scenario(make, lineOf);
      await behindWhoCameMeanwhile(make, lineOf);
    });
  });

  describe('Redis', () => {
    const fixture = useRedisServer();
    it('takes a new place at the back of the line that keeps it out, and leaves the later one', async () => {
      const make = () => {
        const b = new RedisLockBackend(fixture.server.url, { waiterTimeout });
        fixture.cleanup(() => b.close());
        return b;
      };
      // Places whose record still stands (the line keeps a waiter until someone looks at it).
      const lineOf = async (key: string) => {
        const line = (await fixture.admin.keys(`*${key}*:queue`))[0];
        if (!line) return [];
        const owners = await fixture.admin.zrange(line, 0, -1);
        const records = line.replace(/:queue$/, ':waiters');
        const now = Date.now();
        const live: string[] = [];
        for (const owner of owners) {
          const record = await fixture.admin.hget(records, owner);
          if (record && Number(record.split(' ')[0]) > now) live.push(owner);
        }
        return live;
      };
      await scenario(make, lineOf);
      await behindWhoCameMeanwhile(make, lineOf);
    });
  });
});
