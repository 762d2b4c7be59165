import { describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
// @ts-expect-error: node-zookeeper-client ships no types; the test only passes it to the fixture.
import zookeeper from 'node-zookeeper-client';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { connectedClient } from '../fixtures/zookeeper-fenced-store.mjs';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

const worker = resolve(import.meta.dirname, '../fixtures/zookeeper-stress-worker.mjs');

interface WorkerResult {
  acquisitions: number;
  violations: unknown[];
  perKey: Record<string, number>;
}

interface Client {
  create(path: string, data: Buffer, callback: (error: Error | null) => void): void;
  getData(path: string, callback: (error: Error | null, data: Buffer) => void): void;
  close(): void;
}

describe('ZooKeeper backend mutual exclusion under stress', () => {
  const fixture = useZooKeeper();

  it('4 processes x 25 callers on 3 hot keys: no lost update, no stale token, 5,000 fenced acquisitions', async () => {
    const processes = 4;
    const callers = 25;
    const sections = 50;
    const keys = ['hot-a', 'hot-b', 'hot-c'];
    const data = (await connectedClient(zookeeper, fixture.connectionString)) as Client;
    fixture.cleanup(() => data.close());
    const create = (path: string, value: unknown) =>
      new Promise<void>((resolve, reject) => data.create(path, Buffer.from(JSON.stringify(value)), (e) => (e ? reject(e) : resolve())));
    await create('/stress-data', {});
    for (const key of keys) await create(`/stress-data/${key}`, { count: 0, token: 0 });
    const started = Date.now();
    const results = await Promise.all(
      Array.from({ length: processes }, async () => {
        const { stdout } = await promisify(execFile)(
          process.execPath,
          [worker, fixture.connectionString, fixture.root, String(callers), String(sections), keys.join(',')],
          { timeout: 400_000 },
        );
        return JSON.parse(stdout.trim().split('\n').pop()!) as WorkerResult;
      }),
    );
    const acquisitions = results.reduce((sum, r) => sum + r.acquisitions, 0);
    const violations = results.flatMap((r) => r.violations);
    const counts: Record<string, number> = {};
    for (const key of keys) {
      const value = await new Promise<Buffer>((resolve, reject) =>
        data.getData(`/stress-data/${key}`, (e, d) => (e ? reject(e) : resolve(d))),
      );
      counts[key] = (JSON.parse(value.toString()) as { count: number }).count;
    }
    const expected = Object.fromEntries(keys.map((key) => [key, results.reduce((sum, r) => sum + r.perKey[key], 0)]));
    console.log(
      `stress: ${acquisitions} acquisitions by ${processes} processes x ${callers} callers on ${keys.length} keys in ` +
        `${((Date.now() - started) / 1000).toFixed(1)} s, ${violations.length} violations`,
    );
    expect(acquisitions).toBe(processes * callers * sections);
    expect(acquisitions).toBeGreaterThanOrEqual(5_000);
    expect(violations).toEqual([]);
    // Every read-modify-write counted: none was lost to an overlapping holder.
    expect(counts).toEqual(expected);
  }, 480_000);
});
