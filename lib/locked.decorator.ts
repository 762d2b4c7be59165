import type { Observable } from 'rxjs';
import { checkLockedOptions, type LockedOptions } from './distributed-lock.options.js';
import { compileKeySource, keySourceTemplate, type KeyResolver, type LockKeySource } from './lock-key.js';
import { isObservableType, lockOnSubscribe } from './lock-observable.js';
import { LockModuleNotImportedError } from './lock.errors.js';
import type { LockService } from './lock.service.js';
import { declaredParameters } from './parameter-names.js';
import { methodSite } from './lock-identity.js';
import { processShared } from './process-shared.js';

/** Metadata key under which @Locked records a LockedMethod on the method it decorates. */
export const LOCKED_METADATA = 'nest-distributed-lock:locked';

/** Set by the module at start-up on each provider and controller instance, and on the classes with static @Locked methods. */
export const LOCK_SERVICE = Symbol.for('nest-distributed-lock:service');

/**
 * What @Locked declared on one method. Checked once (at start-up, or at the first call of an
 * instance the module did not see) against the method's real parameter names.
 */
export class LockedMethod {
  private compiled: KeyResolver | Error | undefined;
  /** The key as declared (`order:<id>`), which events and metrics name the lock by. */
  readonly template: string;
  /** Stored with the lease as where it was taken (docs/inspection.md): the `site` option, or `Class.method`. */
  readonly site: string;

  constructor(
    readonly className: string,
    readonly methodName: string,
    private readonly ctor: abstract new (...args: never[]) => unknown,
    private readonly source: LockKeySource,
    readonly options: LockedOptions | undefined,
    readonly isStatic = false,
  ) {
    this.template = keySourceTemplate(source, { className, methodName });
    this.site = options?.site ?? methodSite(className, methodName);
  }

  /** Throws the typed error that makes start-up fail when the template or options are wrong. */
  check(): KeyResolver {
    if (this.compiled === undefined) {
      try {
        checkLockedOptions(this.options, `@Locked on ${this.className}.${this.methodName}`);
        const origin = { className: this.className, methodName: this.methodName };
        this.compiled = compileKeySource(this.source, origin, declaredParameters(this.ctor, this.methodName, this.isStatic));
      } catch (error) {
        this.compiled = error as Error;
      }
    }
    if (this.compiled instanceof Error) throw this.compiled;
    return this.compiled;
  }
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- any method: with unknown[], (id: number) => ... would not be assignable
type Method = (...args: any[]) => any;

/**
 * What a @Locked method may return. The wrapper answers asynchronously (a Promise, or an
 * Observable that takes the lock on subscription), so a method typed to return a plain value would
 * lie to its callers; and the lock must cover the work, which a Promise or an Observable describes.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- any method: with unknown[], (id: number) => ... would not be assignable
export type LockableMethod = (...args: any[]) => PromiseLike<unknown> | Observable<unknown>;

/** The key functions among what @Locked was given (a function, or the functions of an array). */
type KeyFunctionsOf<K> = Extract<K extends readonly (infer Item)[] ? Item : K, Method>;

/**
 * The decorator @Locked returns: any other method fails to compile, the error saying what to do.
 * `K` is the key it was given: a key function whose parameters are annotated must accept the
 * method's arguments (an unannotated one takes them as `any`, as TypeScript cannot type it from a
 * method it has not seen yet).
 */
export type LockedDecorator<K = LockKeySource> = <M extends Method>(
  target: object,
  propertyKey: string | symbol,
  descriptor: TypedPropertyDescriptor<M> &
    (M extends LockableMethod ? unknown : '@Locked needs a method that returns a Promise (make it async) or an Observable') &
    ([KeyFunctionsOf<K>] extends [(...args: Parameters<M>) => unknown]
      ? unknown
      : "@Locked key function: its parameters must accept the method's arguments (same types, in the same order, no more required ones)"),
) => void;

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
 * `@Locked(['account:<from>', 'account:<to>'])`. The method must return a Promise or an
 * Observable; an Observable holds the lock while it is subscribed (lock-observable.ts).
 */
export function Locked<K extends LockKeySource>(key: K, options?: LockedOptions): LockedDecorator<K> {
  return (target, propertyKey, descriptor) => {
    const original = descriptor.value as unknown as Method;
    const methodName = String(propertyKey);
    // A static method is decorated on the class itself, an instance method on its prototype.
    const isStatic = typeof target === 'function';
    const ctor = (isStatic ? target : target.constructor) as abstract new (...args: never[]) => unknown;
    if (typeof original !== 'function') {
      throw new TypeError(`@Locked can only decorate methods; ${ctor.name}.${methodName} is not a method.`);
    }
    const spec = new LockedMethod(ctor.name, methodName, ctor, key, options, isStatic);

    const call = function (this: Record<symbol, LockService | undefined>, args: unknown[]): Promise<unknown> {
      const service = this?.[LOCK_SERVICE] ?? activeServices[activeServices.length - 1];
      if (!service) {
        return Promise.reject(
          new LockModuleNotImportedError(
            `@Locked on ${spec.className}.${methodName} ran without a lock backend. Import DistributedLockModule.forRoot() ` +
              `in your application module, and let Nest create ${spec.className} (a provider or controller, not \`new\`). ` +
              `In a test, call \`await moduleRef.init()\` after \`compile()\`: @Locked methods are bound when the module initialises.`,
          ),
        );
      }
      try {
        const keys = service.fullKeys(spec.check()(args, service.options.encodeKeyValues));
        return service.run(keys, () => original.apply(this, args), spec.options, spec.template, spec.site);
      } catch (error) {
        return Promise.reject(error);
      }
    };
    // Only a declared return type is recorded at run time: a method whose Observable type is
    // inferred returns a Promise of its Observable, which Nest awaits and then subscribes to.
    const declaresObservable = isObservableType(Reflect.getMetadata('design:returntype', target, propertyKey));
    const locked = declaresObservable
      ? function (this: Record<symbol, LockService | undefined>, ...args: unknown[]) {
          return lockOnSubscribe(() => call.call(this, args));
        }
      : function (this: Record<symbol, LockService | undefined>, ...args: unknown[]) {
          return call.call(this, args);
        };

    // Route, guard, swagger and any other metadata already on the method must stay visible.
    for (const metadataKey of Reflect.getOwnMetadataKeys(original)) {
      Reflect.defineMetadata(metadataKey, Reflect.getOwnMetadata(metadataKey, original), locked);
    }
    Object.defineProperty(locked, 'name', { value: original.name });
    Object.defineProperty(locked, 'length', { value: original.length });
    Reflect.defineMetadata(LOCKED_METADATA, spec, locked);
    descriptor.value = locked as never;
  };
}
