import { BullModule } from '@nestjs/bullmq';
import { Module, type DynamicModule } from '@nestjs/common';
import { DistributedLockModule, RedisLockBackend } from 'nest-distributed-lock';
import { TenantExport } from './tenant-export.service.js';
import { BUSY_DELAY_MS, EXPORTS_QUEUE, TenantExportsProcessor } from './tenant-exports.processor.js';

export interface TenantExportsOptions {
  /** The Redis of the queue and of the locks: `redis://host:port`. */
  redisUrl: string;
  /** How long a job of a tenant with all its exports running waits before it is tried again, about (default 1000 ms). */
  busyDelayMs?: number;
}

/** A worker of the exports queue: BullMQ for the jobs, the lock module for the per-tenant limit. */
@Module({})
export class TenantExportsModule {
  static forRoot(options: TenantExportsOptions): DynamicModule {
    return {
      module: TenantExportsModule,
      imports: [
        BullModule.forRoot({ connection: connectionOf(options.redisUrl) }),
        BullModule.registerQueue({ name: EXPORTS_QUEUE }),
        DistributedLockModule.forRoot({ backend: new RedisLockBackend(options.redisUrl) }),
      ],
      providers: [TenantExportsProcessor, TenantExport, { provide: BUSY_DELAY_MS, useValue: options.busyDelayMs ?? 1_000 }],
    };
  }
}

/** BullMQ's connection options for a `redis://` URL. */
export function connectionOf(redisUrl: string): { host: string; port: number; username?: string; password?: string; db?: number } {
  const url = new URL(redisUrl);
  return {
    host: url.hostname,
    port: Number(url.port || 6379),
    ...(url.username ? { username: decodeURIComponent(url.username) } : {}),
    ...(url.password ? { password: decodeURIComponent(url.password) } : {}),
    ...(url.pathname.length > 1 ? { db: Number(url.pathname.slice(1)) } : {}),
  };
}
