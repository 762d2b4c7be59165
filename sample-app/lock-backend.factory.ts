import { RedisLockBackend, RedlockLockBackend, type DistributedLockModuleOptions, type LockBackend } from 'nest-distributed-lock';
import type { ShopConfig } from './shop.config.js';

/**
 * The lock backend comes from the environment: REDLOCK_URLS, else REDIS_URL, else in-process.
 * The in-process backend is right for one process only; every instance of a shop that runs
 * several must point at the same Redis (or the same Redlock masters). Backends built from URLs
 * own their connections: the lock module closes them on shutdown, after releasing held locks.
 */
export function lockModuleOptions(config: ShopConfig): DistributedLockModuleOptions {
  return {
    backend: lockBackend(config),
    ttl: config.lockTtlMs,
    autoExtend: config.lockAutoExtend,
  };
}

function lockBackend(config: ShopConfig): LockBackend | undefined {
  // Redlock hands out no fencing tokens: the locked purchase then writes without the fence.
  if (config.redlockUrls) return new RedlockLockBackend(config.redlockUrls);
  if (config.redisUrl) return new RedisLockBackend(config.redisUrl);
  return undefined;
}
