import * as lockLibrary from 'nest-distributed-lock';
import type { DistributedLockModuleOptions, LockBackend } from 'nest-distributed-lock';
import type { ShopConfig } from './shop.config.js';

/**
 * The lock backend comes from the environment: REDLOCK_URLS, else REDIS_URL, else in-process.
 * The in-process backend is right for one process only; every instance of a shop that runs
 * several must point at the same Redis.
 */
export function lockModuleOptions(config: ShopConfig): DistributedLockModuleOptions {
  return {
    backend: lockBackend(config),
    ttl: config.lockTtlMs,
    autoExtend: config.lockAutoExtend,
  };
}

function lockBackend(config: ShopConfig): LockBackend | undefined {
  if (config.redlockUrls) {
    return construct('RedlockBackend', 'REDLOCK_URLS', config.redlockUrls);
  }
  if (config.redisUrl) {
    return construct('RedisLockBackend', 'REDIS_URL', config.redisUrl);
  }
  return undefined;
}

type BackendClass = new (arg: unknown) => LockBackend;

/**
 * Looked up by name on the package entry, so the shop builds against a version of the library
 * that does not export this backend yet, and says so plainly when it is asked for.
 */
function construct(exportName: string, variable: string, arg: unknown): LockBackend {
  const Backend = (lockLibrary as unknown as Record<string, BackendClass | undefined>)[exportName];
  if (typeof Backend !== 'function') {
    throw new Error(
      `${variable} is set, but this build of nest-distributed-lock has no ${exportName} yet. ` +
        (variable === 'REDLOCK_URLS' ? 'Set REDIS_URL instead for one Redis, or unset both' : `Unset ${variable}`) +
        ' for in-process locks (one process only).',
    );
  }
  return new Backend(arg);
}
