import { ConfigurableModuleBuilder, Module, type DynamicModule, type Provider } from '@nestjs/common';
import { APP_INTERCEPTOR, DiscoveryModule, ModulesContainer } from '@nestjs/core';
import { LockBackend } from './backends/lock-backend.interface.js';
import { MemoryLockBackend } from './backends/memory.backend.js';
import { DISTRIBUTED_LOCK_OPTIONS } from './distributed-lock.constants.js';
import { LockedMethodsExplorer } from './distributed-lock.explorer.js';
import { applicationLockService } from './distributed-lock.registry.js';
import { checkModuleExtras, type DistributedLockModuleExtras, type DistributedLockModuleOptions } from './distributed-lock.options.js';
import { LockHealthIndicator } from './lock.health-indicator.js';
import { LockInterceptor } from './lock.interceptor.js';
import { LockService } from './lock.service.js';

const { ConfigurableModuleClass, ASYNC_OPTIONS_TYPE, OPTIONS_TYPE } = new ConfigurableModuleBuilder<DistributedLockModuleOptions>({
  optionsInjectionToken: DISTRIBUTED_LOCK_OPTIONS,
})
  .setClassMethodName('forRoot')
  .setFactoryMethodName('createDistributedLockOptions')
  .setExtras<DistributedLockModuleExtras>({ isGlobal: false, interceptor: true }, (definition, extras) => {
    checkModuleExtras(extras);
    return {
      ...definition,
      global: extras.isGlobal,
      imports: [DiscoveryModule, ...(definition.imports ?? [])],
      providers: [...(definition.providers ?? []), ...providers, ...(extras.interceptor ? [appWideInterceptor] : [])],
      exports: [LockService, LockBackend, LockHealthIndicator],
    };
  })
  .build();

/** `forRoot` options: the module options, plus `isGlobal` and `interceptor`. */
export type DistributedLockModuleForRootOptions = typeof OPTIONS_TYPE;

/**
 * `forRootAsync` options: `useFactory` (with `inject`), `useClass` or `useExisting` (a
 * DistributedLockOptionsFactory), `imports`, and `isGlobal` and `interceptor` next to them.
 */
export type DistributedLockModuleAsyncOptions = typeof ASYNC_OPTIONS_TYPE;

/** What `forRootAsync({ useClass })` and `forRootAsync({ useExisting })` expect. */
export interface DistributedLockOptionsFactory {
  createDistributedLockOptions(): DistributedLockModuleOptions | Promise<DistributedLockModuleOptions>;
}

const providers: Provider[] = [
  {
    provide: LockService,
    // Options are checked here, so a wrong one stops the app at start-up with its name. One
    // service per application, however many modules import this one (distributed-lock.registry.ts).
    useFactory: (options: DistributedLockModuleOptions | undefined, container: ModulesContainer) =>
      applicationLockService(container, options, () => {
        const { backend, ...rest } = options ?? {};
        return new LockService(backend ?? new MemoryLockBackend(), { backend, ...rest });
      }),
    inject: [DISTRIBUTED_LOCK_OPTIONS, ModulesContainer],
  },
  { provide: LockBackend, useFactory: (service: LockService) => service.backend, inject: [LockService] },
  LockedMethodsExplorer,
  LockHealthIndicator,
];

// App-wide, not only on @Locked handlers: a busy lock deep inside a service called by a handler
// must still answer 409 (or the transport's equivalent), not 500. `interceptor: false` leaves the
// binding to apps that register LockInterceptor (or a subclass) themselves.
const appWideInterceptor: Provider = { provide: APP_INTERCEPTOR, useClass: LockInterceptor };

@Module({})
export class DistributedLockModule extends ConfigurableModuleClass {
  /** No arguments: the in-memory backend (one process). */
  static override forRoot(options: DistributedLockModuleForRootOptions = {}): DynamicModule {
    return super.forRoot(options);
  }

  /**
   * Options from config: `forRootAsync({ imports: [ConfigModule], inject: [ConfigService],
   * useFactory })`, or `useClass` / `useExisting` with a DistributedLockOptionsFactory.
   */
  static override forRootAsync(options: DistributedLockModuleAsyncOptions): DynamicModule {
    return super.forRootAsync(options);
  }
}
