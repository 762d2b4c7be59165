import { Injectable } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { InvalidLockOptionsError } from './lock.errors.js';
import { LockService } from './lock.service.js';

/** The key a health check reads (never takes): under the module's prefix, so within the lock user's rights. */
export const HEALTH_PROBE_KEY = 'health:probe';

/** Default longest wait for the backend's answer. */
export const DEFAULT_HEALTH_TIMEOUT_MS = 1_000;

/** One indicator's entry, the shape `@nestjs/terminus` expects (`HealthIndicatorResult`). */
export type LockHealthResult<Key extends string> = Record<Key, { status: 'up' | 'down'; backend: string; [detail: string]: unknown }>;

/**
 * A health indicator for `@nestjs/terminus`: the lock backend answers a read of a probe key within
 * a timeout, and reports what it knows of its servers (Redis: `role`; Redlock: `mastersUp`,
 * `masters`, `quorum`). It imports nothing from Terminus (an app without it loads this package as
 * before): its result is the plain object Terminus's `HealthCheckService.check` takes.
 *
 *     this.health.check([() => this.locks.isHealthy('locks', { timeout: 500 })])
 */
@Injectable()
export class LockHealthIndicator {
  constructor(private readonly locks: LockService) {}

  async isHealthy<const Key extends string = 'locks'>(key?: Key, options: { timeout?: number } = {}): Promise<LockHealthResult<Key>> {
    const name = (key ?? 'locks') as Key;
    const timeout = options.timeout ?? DEFAULT_HEALTH_TIMEOUT_MS;
    if (typeof timeout !== 'number' || !Number.isFinite(timeout) || timeout <= 0) {
      throw new InvalidLockOptionsError(
        'timeout',
        `LockHealthIndicator.isHealthy: timeout must be a positive number of milliseconds, got ${String(timeout)}.`,
      );
    }
    const backend = this.locks.backend;
    const started = performance.now();
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the ${backend.name} backend did not answer within ${timeout} ms`)), timeout);
    });
    try {
      // The probe goes the way a lock operation goes (same script, same key prefix, same rights).
      const [, health] = await Promise.race([Promise.all([this.locks.inspect(HEALTH_PROBE_KEY), backend.health?.()]), late]);
      const latencyMs = Math.round((performance.now() - started) * 10) / 10;
      const entry = { backend: backend.name, latencyMs, ...health?.details };
      if (health && !health.up) return resultOf(name, { status: 'down', ...entry, message: health.message });
      return resultOf(name, { status: 'up', ...entry });
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      return resultOf(name, { status: 'down', backend: backend.name, message });
    } finally {
      clearTimeout(timer);
    }
  }
}

function resultOf<Key extends string>(key: Key, entry: LockHealthResult<Key>[Key]): LockHealthResult<Key> {
  return { [key]: entry } as LockHealthResult<Key>;
}
