import { Module, type DynamicModule, type InjectionToken, type ModuleMetadata, type OptionalFactoryDependency, type Provider } from '@nestjs/common';
import { APP_INTERCEPTOR, DiscoveryModule } from '@nestjs/core';
import { LockBackend } from './backends/lock-backend.interface.js';
import { MemoryLockBackend } from './backends/memory.backend.js';
import { DISTRIBUTED_LOCK_OPTIONS } from './distributed-lock.constants.js';
import { LockedMethodsExplorer } from './distributed-lock.explorer.js';
import type { DistributedLockModuleOptions } from './distributed-lock.options.js';
import { LockInterceptor } from './lock.interceptor.js';
import { LockService } from './lock.service.js';

export interface DistributedLockModuleAsyncOptions extends Pick<ModuleMetadata, 'imports'> {
  useFactory: (...args: any[]) => DistributedLockModuleOptions | Promise<DistributedLockModuleOptions>;
  inject?: (InjectionToken | OptionalFactoryDependency)[];
  /** Make LockService injectable everywhere without importing the module again. */
  isGlobal?: boolean;
}

const providers: Provider[] = [
  {
    provide: LockService,
    // Options are checked here, so a wrong one stops the app at start-up with its name.
    useFactory: (options: DistributedLockModuleOptions | undefined) => {
      const { backend, ...rest } = options ?? {};
      return new LockService(backend ?? new MemoryLockBackend(), { backend, ...rest });
    },
    inject: [DISTRIBUTED_LOCK_OPTIONS],
  },
  { provide: LockBackend, useFactory: (service: LockService) => service.backend, inject: [LockService] },
  LockedMethodsExplorer,
  // App-wide, not only on @Locked handlers: a busy lock deep inside a service called by a handler
  // must still answer 409 (or the transport's equivalent), not 500.
  { provide: APP_INTERCEPTOR, useClass: LockInterceptor },
];

@Module({})
export class DistributedLockModule {
  /** No arguments: the in-memory backend (one process). */
  static forRoot(options: DistributedLockModuleOptions & { isGlobal?: boolean } = {}): DynamicModule {
    const { isGlobal, ...rest } = options;
    return {
      module: DistributedLockModule,
      global: isGlobal,
      imports: [DiscoveryModule],
      providers: [{ provide: DISTRIBUTED_LOCK_OPTIONS, useValue: rest }, ...providers],
      exports: [LockService, LockBackend],
    };
  }

  /** Options from config: `forRootAsync({ imports: [ConfigModule], inject: [ConfigService], useFactory })`. */
  static forRootAsync(options: DistributedLockModuleAsyncOptions): DynamicModule {
    return {
      module: DistributedLockModule,
      global: options.isGlobal,
      imports: [DiscoveryModule, ...(options.imports ?? [])],
      providers: [{ provide: DISTRIBUTED_LOCK_OPTIONS, useFactory: options.useFactory, inject: options.inject ?? [] }, ...providers],
      exports: [LockService, LockBackend],
    };
  }
}
