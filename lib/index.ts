export { DistributedLockModule, type DistributedLockModuleAsyncOptions } from './distributed-lock.module.js';
export { DISTRIBUTED_LOCK_OPTIONS } from './distributed-lock.constants.js';
export type { AcquireOptions, DistributedLockModuleOptions, LockOptions, OnBusy, UsingOptions } from './distributed-lock.options.js';
export { Locked, LOCKED_METADATA } from './locked.decorator.js';
export { LockInterceptor, type LockConflictBody } from './lock.interceptor.js';
export { LockService, type LockInfo } from './lock.service.js';
export { LockHandle } from './lock.handle.js';
export type { LockKeyFunction, LockKeySource, LockKeyValue } from './lock-key.js';
export {
  DistributedLockError,
  InvalidLockKeyError,
  InvalidLockOptionsError,
  LockBackendError,
  LockLostError,
  LockModuleNotImportedError,
  LockNotAcquiredError,
  type LockLostReason,
} from './lock.errors.js';
export { LockBackend, type AcquireResult, type ExtendResult, type LockState } from './backends/lock-backend.interface.js';
export { MemoryLockBackend } from './backends/memory.backend.js';
export { RedisLockBackend } from './backends/redis/redis.backend.js';
export type { RedisClusterConnectionOptions, RedisLockBackendOptions, RedisLockConnection } from './backends/redis/redis.options.js';
