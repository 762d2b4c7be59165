import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import { PgBouncer } from '../support/pgbouncer.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { fullStressSections } from '../support/stress-size.js';

const worker = resolve(import.meta.dirname, '../fixtures/postgres-stress-worker.mjs');

/**
 * `npm test` runs each path with 20 sections per caller (2 000 acquisitions, the same contention:
 * 4 processes x 25 callers on 3 keys); `npm run test:postgres:stress` (POSTGRES_STRESS=full) runs
 * 200 per caller (or STRESS_SECTIONS), 20 000 on each path, which takes minutes on a loaded machine.
 */
const full = process.env.POSTGRES_STRESS === 'full';
const processes = 4;
const callers = 25;
const sections = full ? fullStressSections() : 20;
const keys = ['hot-a', 'hot-b', 'hot-c'];
const total = processes * callers * sections;
const timeout = full ? 900_000 : 150_000;

interface WorkerResult {
  acquisitions: number;
  violations: unknown[];
  perKey: Record<string, number>;
}

describe('PostgreSQL backend mutual exclusion under stress', () => {
  const fixture = usePostgresServer();
  let bouncer: PgBouncer;

  beforeAll(async () => {
    bouncer = await PgBouncer.start(fixture.server.port);
  }, 30_000);
  afterAll(async () => {
    await bouncer?.stop();
  });

  /** Runs the workers; locks and data through `url`, LISTEN on `listenUrl` when given. */
  async function stress(path: string, url: string, listenUrl?: string): Promise<void> {
    await fixture.admin.query('DROP TABLE IF EXISTS stress_values');
    await fixture.admin.query('CREATE TABLE stress_values (key text PRIMARY KEY, count int NOT NULL, token bigint NOT NULL)');
    const started = Date.now();
    const results = await Promise.all(
      Array.from({ length: processes }, async () => {
        const args = [worker, url, url, String(callers), String(sections), keys.join(','), ...(listenUrl ? [listenUrl] : [])];
        const { stdout } = await promisify(execFile)(process.execPath, args, { timeout: timeout - 10_000 });
        return JSON.parse(stdout.trim().split('\n').pop()!) as WorkerResult;
      }),
    );
    const acquisitions = results.reduce((sum, r) => sum + r.acquisitions, 0);
    const violations = results.flatMap((r) => r.violations);
    const { rows } = await fixture.admin.query<{ key: string; count: number }>('SELECT key, count FROM stress_values ORDER BY key');
    const counts = Object.fromEntries(rows.map((r) => [r.key, r.count]));
    const expected = Object.fromEntries(keys.map((key) => [key, results.reduce((sum, r) => sum + r.perKey[key], 0)]));
    console.log(
      `stress ${path}: ${acquisitions} acquisitions by ${processes} processes x ${callers} callers on ${keys.length} keys in ` +
        `${((Date.now() - started) / 1000).toFixed(1)} s, ${violations.length} violations`,
    );
    expect(acquisitions).toBe(total);
    expect(violations).toEqual([]);
    // Every read-modify-write counted: none was lost to an overlapping holder.
    expect(counts).toEqual(expected);
  }

  it(
    `${processes} processes x ${callers} callers on ${keys.length} hot keys, directly: no lost update, no stale token, ${total} acquisitions`,
    () => stress('directly', fixture.url),
    timeout,
  );

  it(
    `the same through pgbouncer in transaction mode (LISTEN direct): no lost update, no stale token, ${total} acquisitions`,
    () => stress('through pgbouncer', bouncer.url(new URL(fixture.url).pathname.slice(1)), fixture.url),
    timeout,
  );
});
