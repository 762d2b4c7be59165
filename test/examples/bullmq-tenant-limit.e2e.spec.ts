import { describe, expect, it } from '@jest/globals';
import { Queue } from 'bullmq';
import { fork, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { EXPORTS_PER_TENANT, EXPORTS_QUEUE } from '../../examples/bullmq-tenant-limit/tenant-exports.processor.js';
// @ts-expect-error: a plain ESM fixture shared with the worker processes, without types.
import { PermitRegister } from '../fixtures/permit-register.mjs';
import { useRedisServer } from '../support/redis-fixture.js';
import { until } from '../support/wait.js';

const root = resolve(import.meta.dirname, '../..');
const WORKERS = 3;
const TENANTS = ['acme', 'globex', 'initech'];
const JOBS_PER_TENANT = 10;

/** A worker process of the example (test/fixtures/bullmq-tenant-worker.mjs), once it runs. */
async function startWorker(redisUrl: string): Promise<ChildProcess> {
  if (!existsSync(resolve(root, 'dist-dev/examples/bullmq-tenant-limit/tenant-exports.module.js'))) {
    throw new Error('The example is not built: run `npm run build:sample` (npm test does it in pretest).');
  }
  const child = fork(resolve(root, 'test/fixtures/bullmq-tenant-worker.mjs'), [redisUrl, '100'], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  await new Promise<void>((ready, failed) => {
    child.once('message', () => ready());
    child.once('exit', (code) => failed(new Error(`a worker exited with ${code} before it was ready`)));
  });
  return child;
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = once(child, 'exit');
  child.kill('SIGTERM');
  const late = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(late);
}

/**
 * examples/bullmq-tenant-limit: three worker processes of four slots each take a queue of exports
 * of three tenants; the semaphore keeps each tenant to EXPORTS_PER_TENANT exports at once, and a
 * job of a tenant that has them all running goes back to the queue, delayed, instead of holding a
 * slot. A register on Redis counts the permit holders of each tenant as they run.
 */
describe('BullMQ: exports limited per tenant across worker processes', () => {
  const redis = useRedisServer();

  it('never runs more than the limit of a tenant at once, reaches it, and finishes every job once', async () => {
    const workers: ChildProcess[] = [];
    // Before the server stops: a worker finishes its jobs and releases their permits on the way out.
    redis.cleanup(() => Promise.all(workers.map(stop)));
    await Promise.all(Array.from({ length: WORKERS }, () => startWorker(redis.server.url).then((child) => workers.push(child))));
    const queue = new Queue(EXPORTS_QUEUE, { connection: { host: '127.0.0.1', port: redis.server.port } });
    redis.cleanup(() => queue.close());

    const total = TENANTS.length * JOBS_PER_TENANT;
    // Interleaved, as tenants' requests arrive: every worker's first jobs are of several tenants.
    await queue.addBulk(
      Array.from({ length: total }, (_, i) => ({ name: 'export', data: { tenantId: TENANTS[i % TENANTS.length], durationMs: 300 } })),
    );
    await until(
      async () => {
        const counts = await queue.getJobCounts('completed', 'failed');
        return counts.completed + counts.failed === total;
      },
      25_000,
      'every export to finish',
    );

    expect(await queue.getJobCounts('completed', 'failed')).toEqual({ completed: total, failed: 0 });
    for (const tenant of TENANTS) {
      expect({ tenant, ...(await PermitRegister.read(redis.admin, tenant)) }).toEqual({
        tenant,
        max: EXPORTS_PER_TENANT,
        entered: JOBS_PER_TENANT,
        refused: 0,
      });
    }
    expect(await PermitRegister.processes(redis.admin)).toBe(WORKERS);
    // Some jobs found their tenant full and were tried again later: the path a full tenant takes ran.
    const jobs = await queue.getJobs(['completed']);
    expect(Math.max(...jobs.map((job) => job.attemptsStarted))).toBeGreaterThan(1);
    expect(jobs.every((job) => job.attemptsMade <= 1)).toBe(true);
  });
});
