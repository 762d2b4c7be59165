import { Injectable, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner } from '@nestjs/core';
import { LOCK_SERVICE, LOCKED_METADATA, registerFallbackService, type LockedMethod } from './locked.decorator.js';
import { checkBackendHolds, limitOf } from './lock-mode.js';
import { LockService } from './lock.service.js';

/**
 * At start-up, finds every @Locked method, instance or static, on the app's providers and
 * controllers, checks its key templates against the real parameter names and its kind of lock
 * against the backend (a wrong name, or a shared lock on a backend without shared holders, fails
 * start-up), and binds each instance, and each class with static @Locked methods, to this app's
 * LockService.
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
      const metatype = wrapper.metatype as { prototype?: object } | undefined;
      const prototype = metatype?.prototype;
      if (!prototype || typeof metatype !== 'function') continue;
      let locked = false;
      for (const name of this.scanner.getAllMethodNames(prototype)) {
        const spec = lockedSpec((prototype as Record<string, unknown>)[name]);
        if (!spec) continue;
        this.check(spec);
        locked = true;
      }
      if (this.checkStatics(metatype)) this.bindClass(metatype as Record<symbol, unknown>);
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
    // A class outlives the app (another app of the process may use it): unbind only our own.
    for (const type of this.boundClasses) if (type[LOCK_SERVICE] === this.service) delete type[LOCK_SERVICE];
    this.boundClasses.clear();
  }

  /** The same check the call makes, made before the first call: start-up fails, not the first request. */
  private check(spec: LockedMethod): void {
    spec.check();
    checkBackendHolds(this.service.backend, limitOf(spec.options), [spec.template], `@Locked on ${spec.className}.${spec.methodName}`);
  }

  private readonly boundClasses = new Set<Record<symbol, unknown>>();

  /** Checks the static @Locked methods of a class and of the classes it extends; whether it has any. */
  private checkStatics(type: object): boolean {
    let found = false;
    for (let current: object | null = type; current && current !== Function.prototype; current = Object.getPrototypeOf(current)) {
      for (const name of Object.getOwnPropertyNames(current)) {
        const spec = lockedSpec(Object.getOwnPropertyDescriptor(current, name)?.value);
        if (!spec) continue;
        this.check(spec);
        found = true;
      }
    }
    return found;
  }

  /** A static method's `this` is its class: that is where it finds this app's service. */
  private bindClass(type: Record<symbol, unknown>): void {
    type[LOCK_SERVICE] = this.service;
    this.boundClasses.add(type);
  }
}

function lockedSpec(method: unknown): LockedMethod | undefined {
  return typeof method === 'function' ? (Reflect.getMetadata(LOCKED_METADATA, method) as LockedMethod | undefined) : undefined;
}
