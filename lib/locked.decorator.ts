import { checkUsingOptions, type UsingOptions } from './distributed-lock.options.js';
import { compileKeySource, type KeyResolver, type LockKeySource } from './lock-key.js';
import { LockModuleNotImportedError } from './lock.errors.js';
import type { LockService } from './lock.service.js';
import { parameterNames } from './parameter-names.js';
import { processShared } from './process-shared.js';

/** Metadata key under which @Locked records a LockedMethod on the method it decorates. */
export const LOCKED_METADATA = 'nest-distributed-lock:locked';

/** Set on each provider and controller instance by the module at start-up. */
export const LOCK_SERVICE = Symbol.for('nest-distributed-lock:service');

/**
 * What @Locked declared on one method. Checked once (at start-up, or at the first call of an
 * instance the module did not see) against the method's real parameter names.
 */
export class LockedMethod {
  private compiled: KeyResolver | Error | undefined;

  constructor(
    readonly className: string,
    readonly methodName: string,
    private readonly ctor: abstract new (...args: never[]) => unknown,
    private readonly source: LockKeySource,
    readonly options: UsingOptions | undefined,
  ) {}

  /** Throws the typed error that makes start-up fail when the template or options are wrong. */
  check(): KeyResolver {
    if (this.compiled === undefined) {
      try {
        checkUsingOptions(this.options, `@Locked on ${this.className}.${this.methodName}`);
        const origin = { className: this.className, methodName: this.methodName };
        this.compiled = compileKeySource(this.source, origin, parameterNames(this.ctor, this.methodName));
      } catch (error) {
        this.compiled = error as Error;
      }
    }
    if (this.compiled instanceof Error) throw this.compiled;
    return this.compiled;
  }
}

type Method = (...args: any[]) => any;

const activeServices = processShared('fallback-services@1', (): LockService[] => []);

/** @internal The module registers its service for instances it could not bind (request-scoped). */
export function registerFallbackService(service: LockService): () => void {
  activeServices.push(service);
  return () => {
    const index = activeServices.lastIndexOf(service);
    if (index >= 0) activeServices.splice(index, 1);
  };
}

/**
 * Runs the method holding the lock named by `key`, resolved from its arguments (after Nest's
 * pipes): `@Locked('order:<id>')`, `@Locked('cart:<dto.cartId>')`, `@Locked((a, b) => ...)`,
 * `@Locked(['account:<from>', 'account:<to>'])`. The decorated method returns a Promise.
 */
export function Locked(key: LockKeySource, options?: UsingOptions): MethodDecorator {
  return (target, propertyKey, descriptor) => {
    const original = descriptor.value as unknown as Method;
    const methodName = String(propertyKey);
    const ctor = (target as { constructor: abstract new (...args: never[]) => unknown }).constructor;
    if (typeof original !== 'function') {
      throw new TypeError(`@Locked can only decorate methods; ${ctor.name}.${methodName} is not a method.`);
    }
    const spec = new LockedMethod(ctor.name, methodName, ctor, key, options);

    const locked = function (this: Record<symbol, LockService | undefined>, ...args: unknown[]) {
      const service = this?.[LOCK_SERVICE] ?? activeServices[activeServices.length - 1];
      if (!service) {
        return Promise.reject(
          new LockModuleNotImportedError(
            `@Locked on ${spec.className}.${methodName} ran without a lock backend. Import DistributedLockModule.forRoot() ` +
              `in your application module, and let Nest create ${spec.className} (a provider or controller, not \`new\`).`,
          ),
        );
      }
      try {
        const keys = service.fullKeys(spec.check()(args));
        return service.run(keys, () => original.apply(this, args), spec.options);
      } catch (error) {
        return Promise.reject(error);
      }
    };

    // Route, guard, swagger and any other metadata already on the method must stay visible.
    for (const metadataKey of Reflect.getOwnMetadataKeys(original)) {
      Reflect.defineMetadata(metadataKey, Reflect.getOwnMetadata(metadataKey, original), locked);
    }
    Object.defineProperty(locked, 'name', { value: original.name });
    Object.defineProperty(locked, 'length', { value: original.length });
    Reflect.defineMetadata(LOCKED_METADATA, spec, locked);
    descriptor.value = locked as never;
    return descriptor;
  };
}
