import { describe, expect, it, jest } from '@jest/globals';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
// @ts-expect-error: node-zookeeper-client ships no types; the test only passes it to the fixture.
import zookeeper from 'node-zookeeper-client';
// @ts-expect-error: a plain ESM fixture shared with the child processes, without types.
import { connectedClient } from '../fixtures/zookeeper-fenced-store.mjs';
import { useEtcdCluster } from '../support/etcd-fixture.js';
import { useMariadbServer } from '../support/mariadb-fixture.js';
import { usePostgresServer } from '../support/postgres-fixture.js';
import { previousRelease } from '../support/previous-release.js';
import { useRedisServer } from '../support/redis-fixture.js';
import { useZooKeeper } from '../support/zookeeper-fixture.js';

/**
 * A rolling upgrade: processes of the previous release (its packed package, see
 * support/previous-release.ts) and of this one share a store and contend for the same keys, as
 * during a deploy. Each process runs the stress test's fenced read-modify-writes (stress-loop.mjs);
 * those of this release also take some sections as readers (shared locks) on a store whose
 * previous release held shared locks too, or where an older process must keep out of a key that
 * readers hold. Two holders of one key at once show as a lost update, a stale token, or a record
 * that changed under a reader.
 */
const previous = previousRelease();
const fixtures = (name: string) => resolve(import.meta.dirname, `../fixtures/${name}-stress-worker.mjs`);
const callers = 5;
const sections = 15;
const keys = ['mixed-a', 'mixed-b'];
// Four processes of 5 callers: seconds on an idle machine, a minute on a loaded one.
jest.setTimeout(150_000);

interface WorkerResult {
  acquisitions: number;
  violations: unknown[];
  perKey: Record<string, number>;
}

/** Two processes of each release at once; every third section of this release's is a reader's. */
async function mixed(
  worker: string,
  args: (callers: string, sections: string) => string[],
): Promise<{ results: WorkerResult[]; writes: Record<string, number> }> {
  const run = async (env: NodeJS.ProcessEnv) => {
    const { stdout } = await promisify(execFile)(process.execPath, [worker, ...args(String(callers), String(sections))], {
      env: { ...process.env, ...env },
      timeout: 120_000,
    });
    return JSON.parse(stdout.trim().split('\n').pop()!) as WorkerResult;
  };
  const results = await Promise.all([
    run({ LOCK_LIBRARY: previous.entry }),
    run({ LOCK_LIBRARY: previous.entry }),
    run({ STRESS_SHARED_EVERY: '3' }),
    run({ STRESS_SHARED_EVERY: '3' }),
  ]);
  const writes = Object.fromEntries(keys.map((key) => [key, results.reduce((sum, r) => sum + r.perKey[key], 0)]));
  return { results, writes };
}

function expectOneHolderAtATime({ results }: { results: WorkerResult[] }): void {
  expect(results.flatMap((r) => r.violations)).toEqual([]);
  expect(results.map((r) => r.acquisitions)).toEqual(results.map(() => callers * sections));
}

describe(`processes of the previous release (${previous.name}) and of this one on one store`, () => {
  describe('Redis', () => {
    const fixture = useRedisServer();
    it('never hold one key at once', async () => {
      const outcome = await mixed(fixtures('redis'), (c, s) => [fixture.server.url, c, s, keys.join(',')]);
      expectOneHolderAtATime(outcome);
      for (const key of keys) expect(Number((await fixture.admin.get(`value:${key}`))!.split(':')[0])).toBe(outcome.writes[key]);
    });
  });

  describe('PostgreSQL', () => {
    const fixture = usePostgresServer();
    it('never hold one key at once', async () => {
      await fixture.admin.query(
        'CREATE TABLE IF NOT EXISTS stress_values (key text PRIMARY KEY, count int NOT NULL, token bigint NOT NULL)',
      );
      const outcome = await mixed(fixtures('postgres'), (c, s) => [fixture.url, fixture.url, c, s, keys.join(',')]);
      expectOneHolderAtATime(outcome);
      const { rows } = await fixture.admin.query<{ key: string; count: number }>('SELECT key, count FROM stress_values');
      expect(Object.fromEntries(rows.map((r) => [r.key, r.count]))).toEqual(outcome.writes);
    });
  });

  describe('MySQL', () => {
    const fixture = useMariadbServer();
    it('never hold one key at once', async () => {
      await fixture.admin.query(
        'CREATE TABLE IF NOT EXISTS stress_values (lock_key VARCHAR(64) PRIMARY KEY, count INT NOT NULL, token BIGINT NOT NULL) ENGINE = InnoDB',
      );
      const outcome = await mixed(fixtures('mysql'), (c, s) => [fixture.url, fixture.url, c, s, keys.join(',')]);
      expectOneHolderAtATime(outcome);
      const [rows] = await fixture.admin.query('SELECT lock_key, count FROM stress_values');
      expect(Object.fromEntries((rows as { lock_key: string; count: number }[]).map((r) => [r.lock_key, r.count]))).toEqual(outcome.writes);
    });
  });

  describe('etcd', () => {
    const fixture = useEtcdCluster();
    it('never hold one key at once', async () => {
      const outcome = await mixed(fixtures('etcd'), (c, s) => [fixture.endpoints.join(','), c, s, keys.join(',')]);
      expectOneHolderAtATime(outcome);
      for (const key of keys) expect(await fixture.admin.get(`stress-values/${key}`).json()).toMatchObject({ count: outcome.writes[key] });
    });
  });

  describe('ZooKeeper', () => {
    const fixture = useZooKeeper();
    it('never hold one key at once', async () => {
      const data = await connectedClient(zookeeper, fixture.connectionString);
      fixture.cleanup(() => data.close());
      const call = (method: string, ...args: unknown[]) =>
        new Promise<unknown[]>((resolve, reject) =>
          data[method](...args, (error: unknown, ...results: unknown[]) => (error ? reject(error) : resolve(results))),
        );
      await call('create', '/stress-data', Buffer.from('{}'));
      for (const key of keys) await call('create', `/stress-data/${key}`, Buffer.from(JSON.stringify({ count: 0, token: 0 })));
      const outcome = await mixed(fixtures('zookeeper'), (c, s) => [fixture.connectionString, fixture.root, c, s, keys.join(',')]);
      expectOneHolderAtATime(outcome);
      for (const key of keys) {
        const [value] = (await call('getData', `/stress-data/${key}`)) as [Buffer];
        expect(JSON.parse(value.toString())).toMatchObject({ count: outcome.writes[key] });
      }
    });
  });
});
