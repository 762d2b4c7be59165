import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { RedisServer } from '../../support/redis-server.js';
import { RedlockMasters } from './redlock-masters.js';

const run = promisify(execFile);
const worker = resolve(import.meta.dirname, '../../fixtures/redlock-stress-worker.mjs');

const PROCESSES = 4;
const CALLERS = 25;
const KEYS = 3;
const ROUNDS = 50; // 4 x 25 x 50 = 5,000 acquisitions

/**
 * Mutual exclusion across OS processes: each worker (test/fixtures/redlock-stress-worker.mjs)
 * loads the built package and checks every critical section against a witness redis-server.
 */
describe('redlock backend: cross-process mutual exclusion', () => {
  let masters: RedlockMasters;
  let witness: RedisServer;

  beforeAll(async () => {
    [masters, witness] = await Promise.all([RedlockMasters.start(3), RedisServer.start()]);
  }, 30_000);

  afterAll(async () => {
    await Promise.all([masters.stop(), witness.stop()]);
  });

  it(`${PROCESSES} processes x ${CALLERS} callers x ${KEYS} hot keys: zero violations`, async () => {
    const config = JSON.stringify({
      masters: masters.servers.map((s) => s.port),
      witness: witness.port,
      callers: CALLERS,
      rounds: ROUNDS,
      keys: KEYS,
    });
    const started = Date.now();
    const outputs = await Promise.all(
      Array.from({ length: PROCESSES }, () => run(process.execPath, [worker, config], { timeout: 150_000 })),
    );
    const seconds = (Date.now() - started) / 1000;
    const results = outputs.map(
      ({ stdout }) =>
        JSON.parse(stdout.trim().split('\n').pop()!) as { acquired: number; violations: number; failed: number; failures: string[] },
    );

    const store = new Redis(witness.port, '127.0.0.1');
    const counted = (await store.mget(Array.from({ length: KEYS }, (_, i) => `value:hot${i}`))).reduce((sum, v) => sum + Number(v), 0);
    store.disconnect();

    const acquired = results.reduce((sum, r) => sum + r.acquired, 0);
    const violations = results.reduce((sum, r) => sum + r.violations, 0);
    console.log(
      `redlock stress: ${acquired} acquisitions by ${PROCESSES} processes x ${CALLERS} callers on ${KEYS} keys over 3 masters in ${seconds.toFixed(1)} s ` +
        `(${Math.round(acquired / seconds)}/s), ${violations} violations, per process ${results.map((r) => r.acquired).join('/')}`,
    );
    expect(results.flatMap((r) => r.failures)).toEqual([]);
    expect(violations).toBe(0);
    expect(acquired).toBe(PROCESSES * CALLERS * ROUNDS);
    expect(counted).toBe(acquired); // no lost update either
    expect(await masters.keyCounts()).toEqual([0, 0, 0]);
  }, 180_000);
});
