export {
  DistributedLockModule,
  type DistributedLockModuleAsyncOptions,
  type DistributedLockModuleForRootOptions,
  type DistributedLockOptionsFactory,
} from './distributed-lock.module.js';
export { DISTRIBUTED_LOCK_OPTIONS } from './distributed-lock.constants.js';
export type {
  AcquireOptions,
  DistributedLockModuleExtras,
  DistributedLockModuleOptions,
  LockedOptions,
  LockOptions,
  OnBusy,
  RetryAfterFunction,
  UsingOptions,
} from './distributed-lock.options.js';
export { Locked, type LockableMethod, type LockedDecorator } from './locked.decorator.js';
export { LockInterceptor, type LockConflictBody } from './lock.interceptor.js';
export { LOCK_CONFLICT_CODE, LockConflictGraphQLError } from './lock-conflict.graphql-error.js';
export { LockService } from './lock.service.js';
export type { LockHolderInfo, LockInfo, LockList, LockListQuery, LockWaiterInfo } from './lock-inspection.js';
export { LockBoardModule } from './board/lock-board.module.js';
export type { LockBoardGuard, LockBoardOptions } from './board/lock-board.options.js';
export type { LockBoardRow, LockBoardSnapshot } from './board/lock-board.service.js';
export type { LockContentionCounts } from './board/lock-contention.js';
export { LockHealthIndicator, type LockHealthResult } from './lock.health-indicator.js';
export { LockHandle } from './lock.handle.js';
export {
  LockEvents,
  type LockAcquiredEvent,
  type LockBusyEvent,
  type LockEventBase,
  type LockEventListener,
  type LockEventMap,
  type LockEventName,
  type LockExtendedEvent,
  type LockFailedEvent,
  type LockLostEvent,
  type LockReleasedEvent,
} from './lock.events.js';
export { LOCK_TELEMETRY_SCOPE, type LockTelemetryOptions } from './lock.telemetry.js';
export { withLockAbortSignal } from './lock-abort-scope.js';
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
export {
  LockBackend,
  type AcquireResult,
  type BackendHealth,
  type ExtendResult,
  type ImmediateLockSteps,
  type LockHolderIdentity,
  type LockHolderState,
  type LockListOptions,
  type LockListPage,
  type LockState,
  type LockWaiterState,
  MAX_IDENTITY_LENGTH,
  type TryAcquireOptions,
  SHARED,
} from './backends/lock-backend.interface.js';
export { MemoryLockBackend } from './backends/memory.backend.js';
export { RedisLockBackend } from './backends/redis/redis.backend.js';
export type { RedisClusterConnectionOptions, RedisLockBackendOptions, RedisLockConnection } from './backends/redis/redis.options.js';
export { PostgresLockBackend } from './backends/postgres/postgres.backend.js';
export type { PostgresLockBackendOptions, PostgresLockConnection } from './backends/postgres/postgres.options.js';
export { postgresLockTablesSql } from './backends/postgres/postgres.schema.js';
export { EtcdLockBackend } from './backends/etcd/etcd.backend.js';
export type { EtcdLockBackendOptions, EtcdLockConnection } from './backends/etcd/etcd.options.js';
export { RedlockLockBackend } from './backends/redlock/redlock.backend.js';
export type { RedlockLockBackendOptions } from './backends/redlock/redlock.options.js';
export type { RedlockMasterClient, RedlockSubscriberClient } from './backends/redlock/redlock-master.js';
export { RedlockQuorumError, type MasterFailure } from './backends/redlock/redlock.errors.js';
export { ZooKeeperLockBackend } from './backends/zookeeper/zookeeper.backend.js';
export type { ZooKeeperLockBackendOptions } from './backends/zookeeper/zookeeper.options.js';
export { MysqlLockBackend } from './backends/mysql/mysql.backend.js';
export type { MysqlLockBackendOptions, MysqlLockConnection } from './backends/mysql/mysql.options.js';
export { mysqlLockTablesSql } from './backends/mysql/mysql.schema.js';
