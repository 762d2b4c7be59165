import { Injectable, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner } from '@nestjs/core';
import { LOCK_SERVICE, LOCKED_METADATA, registerFallbackService, type LockedMethod } from './locked.decorator.js';
import { LockService } from './lock.service.js';

/**
 * At start-up, finds every @Locked method on the app's providers and controllers, checks its key
 * templates against the real parameter names (a wrong name fails start-up), and binds each
 * instance to this app's LockService.
 */
@Injectable()
export class LockedMethodsExplorer implements OnModuleInit, OnApplicationShutdown {
  private unregister: (() => void) | undefined;

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly service: LockService,
  ) {}

  onModuleInit(): void {
    for (const wrapper of [...this.discovery.getProviders(), ...this.discovery.getControllers()]) {
      const prototype = (wrapper.metatype as { prototype?: object } | undefined)?.prototype;
      if (!prototype || typeof wrapper.metatype !== 'function') continue;
      let locked = false;
      for (const name of this.scanner.getAllMethodNames(prototype)) {
        const spec = Reflect.getMetadata(LOCKED_METADATA, (prototype as Record<string, object>)[name]) as LockedMethod | undefined;
        if (!spec) continue;
        spec.check();
        locked = true;
      }
      const instance = wrapper.instance as Record<symbol, unknown> | undefined;
      if (locked && wrapper.isDependencyTreeStatic() && instance && typeof instance === 'object') {
        instance[LOCK_SERVICE] = this.service;
      }
    }
    // Request-scoped and transient instances are created later, unbound: they use this service.
    this.unregister = registerFallbackService(this.service);
  }

  onApplicationShutdown(): void {
    this.unregister?.();
  }
}
