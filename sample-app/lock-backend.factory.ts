import {
  MysqlLockBackend,
  PostgresLockBackend,
  RedisLockBackend,
  RedlockLockBackend,
  type DistributedLockModuleOptions,
  type LockBackend,
} from 'nest-distributed-lock';
import { checkLockBackend, lockBackendKind, type ShopConfig } from './shop.config.js';

/**
 * The lock backend comes from the environment: LOCK_BACKEND when set, else REDLOCK_URLS, else
 * REDIS_URL, else in-process. The in-process backend is right for one process only; every
 * instance of a shop that runs several must point at the same Redis (or the same Redlock
 * masters, or the same PostgreSQL or MySQL). Backends built from URLs own their connections: the lock
 * module closes them on shutdown, after releasing held locks.
 */
export function lockModuleOptions(config: ShopConfig): DistributedLockModuleOptions {
  return {
    backend: lockBackend(config),
    ttl: config.lockTtlMs,
    autoExtend: config.lockAutoExtend,
  };
}

function lockBackend(config: ShopConfig): LockBackend | undefined {
  checkLockBackend(config);
  switch (lockBackendKind(config)) {
    // Redlock hands out no fencing tokens: the locked purchase then writes without the fence.
    case 'redlock':
      return new RedlockLockBackend(config.redlockUrls!);
    case 'redis':
      return new RedisLockBackend(config.redisUrl!);
    // A pool of its own on the shop's database (closed on shutdown); the lock tables (and, on
    // MySQL, their procedures) are created on first use, next to the shop's.
    case 'postgres':
      return new PostgresLockBackend(config.databaseUrl!);
    case 'mysql':
      return new MysqlLockBackend(config.databaseUrl!);
    case 'memory':
      return undefined;
  }
}
