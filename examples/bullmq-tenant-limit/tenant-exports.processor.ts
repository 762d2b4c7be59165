import { Processor, WorkerHost } from '@nestjs/bullmq';
import { Inject } from '@nestjs/common';
import { DelayedError, type Job } from 'bullmq';
import { LockService } from 'nest-distributed-lock';
import { TenantExport, type ExportJob, type ExportResult } from './tenant-export.service.js';

export const EXPORTS_QUEUE = 'tenant-exports';
/** Exports one tenant runs at once, across every worker process. */
export const EXPORTS_PER_TENANT = 2;
/** Jobs one worker process runs at once, of any tenant. */
export const WORKER_CONCURRENCY = 4;

export const BUSY_DELAY_MS = Symbol('BUSY_DELAY_MS');

/**
 * Runs the queue's exports, at most EXPORTS_PER_TENANT per tenant across every worker: each job
 * takes one of its tenant's permits (a semaphore on `export:<tenantId>`) for as long as it runs.
 */
@Processor(EXPORTS_QUEUE, { concurrency: WORKER_CONCURRENCY })
export class TenantExportsProcessor extends WorkerHost {
  constructor(
    private readonly locks: LockService,
    private readonly exports: TenantExport,
    @Inject(BUSY_DELAY_MS) private readonly busyDelayMs: number,
  ) {
    super();
  }

  async process(job: Job<ExportJob>, token?: string): Promise<ExportResult> {
    const result = await this.locks.using(`export:${job.data.tenantId}`, (permit) => this.exports.run(job.data, permit), {
      permits: EXPORTS_PER_TENANT,
      wait: 0,
      onBusy: 'skip',
    });
    if (result !== undefined) return result;
    // The tenant has all its exports running. Waiting for a permit here would keep one of this
    // worker's slots from every other tenant (and with enough jobs of one busy tenant, all of
    // them); so the job goes back to the queue, delayed, and the slot takes the next job. The
    // jitter spreads a burst of one tenant's jobs over time instead of retrying them together.
    await job.moveToDelayed(Date.now() + this.busyDelayMs * (0.5 + Math.random()), token);
    throw new DelayedError();
  }
}
