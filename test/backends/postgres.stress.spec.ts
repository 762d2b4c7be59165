import { describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import { usePostgresServer } from '../support/postgres-fixture.js';

const worker = resolve(import.meta.dirname, '../fixtures/postgres-stress-worker.mjs');

interface WorkerResult {
  acquisitions: number;
  violations: unknown[];
  perKey: Record<string, number>;
}

describe('PostgreSQL backend mutual exclusion under stress', () => {
  const fixture = usePostgresServer();

  it('4 processes x 25 callers on 3 hot keys: no lost update, no stale token, over 20,000 acquisitions', async () => {
    const processes = 4;
    const callers = 25;
    const sections = 200;
    const keys = ['hot-a', 'hot-b', 'hot-c'];
    await fixture.admin.query('CREATE TABLE stress_values (key text PRIMARY KEY, count int NOT NULL, token bigint NOT NULL)');
    const started = Date.now();
    const results = await Promise.all(
      Array.from({ length: processes }, async () => {
        const { stdout } = await promisify(execFile)(
          process.execPath,
          [worker, fixture.url, fixture.url, String(callers), String(sections), keys.join(',')],
          { timeout: 240_000 },
        );
        return JSON.parse(stdout.trim().split('\n').pop()!) as WorkerResult;
      }),
    );
    const acquisitions = results.reduce((sum, r) => sum + r.acquisitions, 0);
    const violations = results.flatMap((r) => r.violations);
    const { rows } = await fixture.admin.query<{ key: string; count: number }>('SELECT key, count FROM stress_values ORDER BY key');
    const counts = Object.fromEntries(rows.map((r) => [r.key, r.count]));
    const expected = Object.fromEntries(keys.map((key) => [key, results.reduce((sum, r) => sum + r.perKey[key], 0)]));
    console.log(
      `stress: ${acquisitions} acquisitions by ${processes} processes x ${callers} callers on ${keys.length} keys in ` +
        `${((Date.now() - started) / 1000).toFixed(1)} s, ${violations.length} violations`,
    );
    expect(acquisitions).toBe(processes * callers * sections);
    expect(acquisitions).toBeGreaterThanOrEqual(20_000);
    expect(violations).toEqual([]);
    // Every read-modify-write counted: none was lost to an overlapping holder.
    expect(counts).toEqual(expected);
  }, 300_000);
});
