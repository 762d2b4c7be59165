import { describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { compiledShop, runDemo } from './compiled-app.js';

const run = promisify(execFile);

/** `npm run demo` is `node dist-dev/sample-app/demo.js` after a build. */
describe('npm run demo', () => {
  it('prints progress, a table per endpoint and, last, the result as one JSON object', async () => {
    const { stdout, summary } = await runDemo([], {}, 150_000);
    expect(Object.keys(summary)).toEqual(['demo', 'stock', 'buyers', 'results']);
    expect(summary).toMatchObject({ demo: 'oversell', stock: 100, buyers: 500 });
    expect(Object.keys(summary.results)).toEqual(['unsafe', 'locked', 'atomic']);
    for (const result of Object.values<Record<string, number>>(summary.results)) {
      expect(Object.keys(result)).toEqual(['sold', 'stockLeft', 'oversold', 'ms']);
    }
    expect(summary.results.unsafe.oversold).toBeGreaterThan(0);
    expect(summary.results.locked).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });
    expect(summary.results.atomic).toMatchObject({ sold: 100, stockLeft: 0, oversold: 0 });

    expect(stdout).toMatch(/embedded PostgreSQL \(PGlite, in memory\); in-process locks/);
    expect(stdout).toMatch(/\[#{20}\] 500\/500 answered/);
    expect(stdout).toMatch(/^endpoint\s+sold\s+stock left\s+oversold\s+ms$/m);
    for (const endpoint of ['unsafe', 'locked', 'atomic'] as const) {
      const { sold, stockLeft, oversold } = summary.results[endpoint];
      expect(stdout).toMatch(new RegExp(`^${endpoint}\\s+${sold}\\s+${stockLeft}\\s+${oversold}\\s+\\d+$`, 'm'));
    }
  }, 180_000);

  it('--instances N without DATABASE_URL and REDIS_URL says which is missing and exits non-zero', async () => {
    const env = { ...process.env, DATABASE_URL: '', REDIS_URL: '', REDLOCK_URLS: '' };
    const failure = await run(process.execPath, [compiledShop('demo.js'), '--instances', '3'], { env }).then(
      () => undefined,
      (error: { code: number; stderr: string }) => error,
    );
    expect(failure?.code).toBe(2);
    expect(failure?.stderr).toMatch(/--instances 3 runs 3 shop processes .* but DATABASE_URL .* and REDIS_URL .* are not set/);

    const onlyDatabase = await run(process.execPath, [compiledShop('demo.js'), '--instances', '2'], {
      env: { ...env, DATABASE_URL: 'postgres://127.0.0.1:1/none' },
    }).then(
      () => undefined,
      (error: { code: number; stderr: string }) => error,
    );
    expect(onlyDatabase?.code).toBe(2);
    expect(onlyDatabase?.stderr).toMatch(
      /but REDIS_URL \(the Redis that holds their locks; or LOCK_BACKEND=postgres to keep them in DATABASE_URL\) is not set/,
    );
    expect(onlyDatabase?.stderr).toMatch(/LOCK_BACKEND=postgres npm run demo -- --instances 2$/m);
  });
});
