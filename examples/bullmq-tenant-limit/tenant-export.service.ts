import { Injectable } from '@nestjs/common';
import type { LockHandle } from 'nest-distributed-lock';
import { setTimeout } from 'node:timers/promises';

/** What a job asks for: one tenant's export. */
export interface ExportJob {
  tenantId: string;
  /** How long the stand-in export takes, in milliseconds (default 500). */
  durationMs?: number;
}

/** What a finished job returns. */
export interface ExportResult {
  tenantId: string;
  /** The fencing token of the permit the export ran under: it tells the tenant's holders apart. */
  permit: number;
}

/** The export itself: the part of the job that runs while it holds one of its tenant's permits. */
@Injectable()
export class TenantExport {
  async run(job: ExportJob, permit: LockHandle): Promise<ExportResult> {
    // A stand-in for the real work (read the tenant's rows, write a file). It listens to the
    // permit's signal: a permit whose lease is lost (the process stalled past its ttl) stops the
    // export, as another job of the tenant may have its place by then; BullMQ retries the job.
    await setTimeout(job.durationMs ?? 500, undefined, { signal: permit.signal });
    return { tenantId: job.tenantId, permit: permit.fencingToken! };
  }
}
