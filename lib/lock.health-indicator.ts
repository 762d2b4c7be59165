import { Injectable } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { InvalidLockOptionsError } from './lock.errors.js';
import { LockService } from './lock.service.js';
import { newOwnerToken } from './owner-token.js';

/** The key a health check takes and releases at once: under the module's prefix, so within the lock user's rights. */
export const HEALTH_PROBE_KEY = 'health:probe';

/** Default longest wait for the backend's answer. */
export const DEFAULT_HEALTH_TIMEOUT_MS = 1_000;

/** One indicator's entry, the shape `@nestjs/terminus` expects (`HealthIndicatorResult`). */
export type LockHealthResult<Key extends string> = Record<Key, { status: 'up' | 'down'; backend: string; [detail: string]: unknown }>;

/**
 * A health indicator for `@nestjs/terminus`: the lock backend takes and releases a probe key within
 * a timeout (a store that only reads, a read-only role or a replica, is down), and reports what it knows of its servers (Redis: `role`; Redlock: `mastersUp`,
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
      // Both answers kept: what the servers say of themselves (a replica) explains a refused probe best.
      const [probe, reported] = await Promise.race([Promise.allSettled([this.probe(), backend.health?.()]), late]);
      if (reported.status === 'rejected') throw reported.reason;
      const health = reported.value;
      const latencyMs = Math.round((performance.now() - started) * 10) / 10;
      const entry = { backend: backend.name, latencyMs, ...health?.details };
      if (health && !health.up) return resultOf(name, { status: 'down', ...entry, message: health.message });
      if (probe.status === 'rejected') return resultOf(name, { status: 'down', ...entry, message: messageOf(probe.reason) });
      return resultOf(name, { status: 'up', ...entry });
    } catch (error) {
      return resultOf(name, { status: 'down', backend: backend.name, message: messageOf(error) });
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Proves the backend can take a lock: a real acquisition of the probe key by an owner of its
   * own, without waiting, released at once. It goes the way a lock goes (same requests, key
   * prefix and rights), so a store that answers reads but refuses writes (a read-only role or
   * server, missing rights) fails it. A busy answer (another instance's probe holds the key now)
   * is an answer of the lock path too: up. Two round trips, no event, no metric.
   */
  private async probe(): Promise<void> {
    const { backend, options } = this.locks;
    const [key] = this.locks.fullKeys(HEALTH_PROBE_KEY);
    const owner = newOwnerToken();
    const result = await backend.tryAcquire([key], owner, options.ttl, { willWait: false });
    if (result.acquired) await backend.release([key], owner);
  }
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function resultOf<Key extends string>(key: Key, entry: LockHealthResult<Key>[Key]): LockHealthResult<Key> {
  return { [key]: entry } as LockHealthResult<Key>;
}
