import type { ExecutionContext } from '@nestjs/common';
import type { LockBackend } from './backends/lock-backend.interface.js';
import { InvalidLockOptionsError, type LockNotAcquiredError } from './lock.errors.js';
import { checkKindOptions, type LockMode } from './lock-mode.js';
import { IDENTITY_NAME_RULE, defaultInstance, isIdentityName } from './lock-identity.js';
import type { LockTelemetryOptions } from './lock.telemetry.js';
import { show } from './option-value.js';

/** Options for one acquisition (LockService) or one decorated method (@Locked). */
export interface LockOptions {
  /** Lease in milliseconds; extended by the watchdog while the holder runs. Default: module `ttl`. */
  ttl?: number;
  /** How long to wait for a held lock, in milliseconds; 0 tries once. Default: module `wait`. */
  wait?: number;
  /** Extend the lease about every ttl/3 while held. Default: module `autoExtend` (true). */
  autoExtend?: boolean;
  /**
   * Keep the lock at least this long (ms) after it was taken, even when released sooner: the
   * release shortens the lease to what is left of it instead of deleting the key. For scheduled
   * jobs, so that an instance whose timer fires a little later does not run a fast job again.
   */
  minHold?: number;
  /**
   * Never extend the lease past this long (ms) after it was taken: a hung holder cannot keep the
   * lock forever. A holder still running then loses it (LockLostError 'max-hold').
   */
  maxHold?: number;
  /**
   * 'exclusive' (default): one holder at a time. 'shared': a read lock, held by any number of
   * shared holders at once and by no exclusive one; a queued exclusive caller blocks later shared
   * ones (docs/shared-locks.md).
   */
  mode?: LockMode;
  /**
   * A semaphore: at most this many holders of the key at once (a positive integer). Every caller
   * of the key must ask for the same number; a different one is an InvalidLockOptionsError.
   */
  permits?: number;
  /**
   * Where in the code the lock is taken, stored with the lease and the place in line so that
   * `inspect()` can tell who holds or waits (docs/inspection.md): a label of at most 128
   * characters, e.g. 'nightly-report'. Default: `Class.method` for @Locked, none for LockService
   * calls. Never put argument values in it: it is readable by anyone who can read the store.
   */
  site?: string;
}

/** What a busy lock does to a `using()` call or a @Locked method. */
export type OnBusy = 'throw' | 'skip';

/** Options of a @Locked method. Its wait ends early under `withLockAbortSignal` (LockInterceptor: when the client hangs up). */
export interface LockedOptions extends LockOptions {
  /** 'throw' (default) raises LockNotAcquiredError; 'skip' returns undefined without running. */
  onBusy?: OnBusy;
}

export interface UsingOptions extends LockedOptions {
  /**
   * Gives up waiting when aborted: the promise rejects with the signal's reason, `fn` does not run,
   * and the call leaves the queue and the backend's line. Once `fn` runs, aborting changes nothing.
   */
  signal?: AbortSignal;
}

export interface AcquireOptions extends LockOptions {
  /** Gives up waiting when aborted; the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

export interface DistributedLockModuleOptions {
  /** Where leases live. Default: a new MemoryLockBackend (one process only). */
  backend?: LockBackend;
  /** Prepended to every key. Default 'lock:'. */
  keyPrefix?: string;
  /** Default lease in milliseconds. Default 30 000. */
  ttl?: number;
  /** Default wait in milliseconds. Default 10 000. */
  wait?: number;
  /** Default for LockOptions.autoExtend. Default true. */
  autoExtend?: boolean;
  /**
   * Fallback polling period in milliseconds while waiting, for a wake-up the backend may have
   * missed (a dropped pub/sub message). Default 500.
   */
  pollInterval?: number;
  /** Longest key accepted, prefix included. Default 512. */
  maxKeyLength?: number;
  /**
   * What LockInterceptor tells a client to wait before retrying a busy lock (HTTP `Retry-After`,
   * rounded up to whole seconds; `retryAfterMs` in the body): milliseconds, or a function of the
   * error and the request. Default: the holder's remaining lease, at most 1 000 ms.
   */
  retryAfter?: number | RetryAfterFunction;
  /**
   * Percent-encode the values @Locked templates put into keys, so that no two argument lists
   * make the same key (`order:<a>:<b>` with 'x:y','z' and 'x','y:z') and a value cannot end a
   * Cluster hash tag the template opened. Plain ids (letters, digits, `-_.!~*'()`) are unchanged.
   * Default false: values go in as they are.
   */
  encodeKeyValues?: boolean;
  /**
   * Most callers of this process that may wait for one key at once (a multi-key call counts for
   * each key). One more is answered busy at once (LockNotAcquiredError, HTTP 409) instead of
   * queueing: a burst of requests for one hot key then costs nothing while it lasts. Default: no cap.
   */
  maxWaitersPerKey?: number;
  /** Most callers of this process that may wait for any lock at once; as `maxWaitersPerKey`. Default: no cap. */
  maxWaiters?: number;
  /**
   * OpenTelemetry metrics and a span per acquisition, through `@opentelemetry/api` (install it;
   * without an SDK it records nothing): true, or options. Default false. See docs/observability.md.
   */
  telemetry?: boolean | LockTelemetryOptions;
  /**
   * A debug log line (Nest Logger, context 'DistributedLock') for each call that waited for a lock
   * or was refused one. Default false: Nest's default logger shows debug lines.
   */
  debugLogs?: boolean;
  /**
   * The name of this process, stored with each lease and place in line it takes so that
   * `inspect()` can tell which instance holds or waits (docs/inspection.md): at most 128
   * characters, e.g. the pod name. Default `hostname:pid`.
   */
  instance?: string;
}

/** Milliseconds until a retry is worth it; a result that is not a number of 0 or more falls back to the default. */
export type RetryAfterFunction = (error: LockNotAcquiredError, context: ExecutionContext) => number;

/** Options of the module definition itself, given to forRoot / forRootAsync next to the others. */
export interface DistributedLockModuleExtras {
  /** Make LockService injectable everywhere without importing the module again. Default false. */
  isGlobal?: boolean;
  /** Register LockInterceptor app-wide. Default true; false for apps that bind it themselves. */
  interceptor?: boolean;
}

export type ResolvedModuleOptions = Required<
  Omit<DistributedLockModuleOptions, 'backend' | 'retryAfter' | 'maxWaitersPerKey' | 'maxWaiters'>
> &
  Pick<DistributedLockModuleOptions, 'retryAfter' | 'maxWaitersPerKey' | 'maxWaiters'>;

export const MODULE_DEFAULTS: ResolvedModuleOptions = {
  keyPrefix: 'lock:',
  ttl: 30_000,
  wait: 10_000,
  autoExtend: true,
  pollInterval: 500,
  maxKeyLength: 512,
  encodeKeyValues: false,
  telemetry: false,
  debugLogs: false,
  instance: defaultInstance(),
};

/** The longest delay a Node timer keeps: beyond it, setTimeout fires after 1 ms. */
export const MAX_TIMER_MS = 2_147_483_647;

/** @internal What an option accepts, the test, and a sentence that goes after "must be ..., got ...". */
export type Check = [accepts: string, ok: (value: unknown) => boolean, hint?: string];

const withinTimers = (v: unknown) => typeof v === 'number' && Number.isFinite(v) && v > 0 && v <= MAX_TIMER_MS;
const MAX_HINT = `At most ${MAX_TIMER_MS} (about 24.8 days)`;
const positiveMs: Check = ['a positive finite number of milliseconds', withinTimers, `${MAX_HINT}.`];
// A lease reaches Redis as PX, which takes whole milliseconds: the Redis backends round it up, as
// they do with extend(ms), rather than refuse what every other backend takes.
const leaseMs: Check = [
  'a positive finite number of milliseconds',
  withinTimers,
  `${MAX_HINT}; the Redis backends round a fraction up to whole milliseconds.`,
];
const waitMs: Check = ['0 (try once) or a positive finite number of milliseconds', (v) => v === 0 || withinTimers(v), `${MAX_HINT}.`];
const bool: Check = ['true or false', (v) => typeof v === 'boolean'];

const LOCK_OPTIONS: Record<string, Check> = { ttl: leaseMs, wait: waitMs, autoExtend: bool };
const signal: Check = ['an AbortSignal', (v) => v instanceof AbortSignal];
const positiveInteger: Check = ['a positive integer', (v) => Number.isInteger(v) && (v as number) > 0];
const identityName: Check = [
  IDENTITY_NAME_RULE,
  isIdentityName,
  'It is stored with the lease: name the code or the process, not the data.',
];
const PER_LOCK_OPTIONS: Record<string, Check> = {
  ...LOCK_OPTIONS,
  site: identityName,
  minHold: leaseMs,
  maxHold: leaseMs,
  mode: ["'exclusive' or 'shared'", (v) => v === 'exclusive' || v === 'shared', 'For at most n holders at once, use permits: n.'],
  permits: [
    'a positive integer',
    (v) => Number.isSafeInteger(v) && (v as number) > 0,
    "The most holders of the key at once; for any number of readers, use mode: 'shared'.",
  ],
};
const LOCKED_OPTIONS: Record<string, Check> = {
  ...PER_LOCK_OPTIONS,
  onBusy: ["'throw' or 'skip'", (v) => v === 'throw' || v === 'skip'],
};
const USING_OPTIONS: Record<string, Check> = { ...LOCKED_OPTIONS, signal };
const ACQUIRE_OPTIONS: Record<string, Check> = { ...PER_LOCK_OPTIONS, signal };
const MODULE_OPTIONS: Record<string, Check> = {
  ...LOCK_OPTIONS,
  backend: [
    'an object implementing LockBackend (tryAcquire, extend, release, inspect)',
    (v) =>
      typeof v === 'object' &&
      v !== null &&
      ['tryAcquire', 'extend', 'release', 'inspect'].every((m) => typeof (v as Record<string, unknown>)[m] === 'function'),
  ],
  keyPrefix: ['a string (may be empty)', (v) => typeof v === 'string'],
  pollInterval: positiveMs,
  maxKeyLength: positiveInteger,
  maxWaitersPerKey: positiveInteger,
  maxWaiters: positiveInteger,
  retryAfter: [
    'a number of milliseconds (0 or more) or a function (error, context) => milliseconds',
    (v) => typeof v === 'function' || (typeof v === 'number' && Number.isFinite(v) && v >= 0),
  ],
  encodeKeyValues: bool,
  telemetry: [
    'true, false or an object { meterProvider?, tracerProvider?, spanKeys? }',
    (v) => typeof v === 'boolean' || (typeof v === 'object' && v !== null && !Array.isArray(v)),
  ],
  debugLogs: bool,
  instance: identityName,
};
const MODULE_EXTRAS: Record<string, Check> = { isGlobal: bool, interceptor: bool };

/** @internal Each option against its rule: an InvalidLockOptionsError names the first that is unknown or wrong. */
export function check(options: unknown, checks: Record<string, Check>, where: string): void {
  if (options === undefined) return;
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new InvalidLockOptionsError('(options)', `${where}: options must be an object, got ${String(options)}.`);
  }
  for (const name of Object.keys(options)) {
    const value = (options as Record<string, unknown>)[name];
    const rule = checks[name];
    if (!rule) {
      throw new InvalidLockOptionsError(name, `${where}: unknown option '${name}'. Accepted options: ${Object.keys(checks).join(', ')}.`);
    }
    if (value === undefined) continue;
    const [accepts, ok, hint] = rule;
    if (!ok(value)) {
      throw new InvalidLockOptionsError(
        name,
        `${where}: option '${name}' must be ${accepts}, got ${show(value)}.${hint ? ` ${hint}` : ''}`,
      );
    }
  }
}

/** minHold above maxHold cannot both hold. */
function checkHolds(options: unknown, where: string): void {
  const { minHold, maxHold } = (options ?? {}) as LockOptions;
  if (minHold !== undefined && maxHold !== undefined && minHold > maxHold) {
    throw new InvalidLockOptionsError(
      'minHold',
      `${where}: option 'minHold' (${minHold} ms) must not be above 'maxHold' (${maxHold} ms): the lock cannot be kept longer than ` +
        `it may be held. Lower minHold or raise maxHold.`,
    );
  }
}

export function checkLockOptions(options: unknown, where: string): void {
  check(options, LOCK_OPTIONS, where);
}
export function checkLockedOptions(options: unknown, where: string): void {
  if (typeof options === 'object' && options !== null && 'signal' in options) {
    throw new InvalidLockOptionsError(
      'signal',
      `${where}: option 'signal' cannot be fixed on a decorator, as it would be shared by every call. A @Locked method stops ` +
        `waiting when its HTTP request closes (LockInterceptor); for other sources, call it inside withLockAbortSignal(signal, fn).`,
    );
  }
  check(options, LOCKED_OPTIONS, where);
  checkHolds(options, where);
  checkKindOptions(options, where);
}
export function checkUsingOptions(options: unknown, where: string): void {
  check(options, USING_OPTIONS, where);
  checkHolds(options, where);
  checkKindOptions(options, where);
}
export function checkAcquireOptions(options: unknown, where: string): void {
  check(options, ACQUIRE_OPTIONS, where);
  checkHolds(options, where);
  checkKindOptions(options, where);
}
/** Checks `isGlobal` and `interceptor` as forRoot / forRootAsync receive them. */
export function checkModuleExtras(extras: DistributedLockModuleExtras): void {
  for (const [name, rule] of Object.entries(MODULE_EXTRAS)) {
    const value = (extras as Record<string, unknown>)[name];
    if (value !== undefined && !rule[1](value)) {
      throw new InvalidLockOptionsError(name, `DistributedLockModule: option '${name}' must be ${rule[0]}, got ${show(value)}.`);
    }
  }
}

/** Checks module options at start-up, against the backend in use, and fills in the defaults. */
export function resolveModuleOptions(options: DistributedLockModuleOptions | undefined, backend?: LockBackend): ResolvedModuleOptions {
  const extra = Object.keys(options ?? {}).find((name) => name in MODULE_EXTRAS);
  if (extra !== undefined) {
    throw new InvalidLockOptionsError(
      extra,
      `DistributedLockModule: option '${extra}' shapes the module, so it cannot come from a factory or options class. ` +
        `Pass it to forRootAsync({ ${extra}, useFactory, ... }) next to useFactory, useClass or useExisting.`,
    );
  }
  check(options, MODULE_OPTIONS, 'DistributedLockModule');
  const defined = Object.fromEntries(Object.entries(options ?? {}).filter(([name, value]) => name !== 'backend' && value !== undefined));
  const resolved: ResolvedModuleOptions = { ...MODULE_DEFAULTS, ...defined };
  const waiterTimeout = backend?.waiterTimeout;
  // A waiter asks again at least every pollInterval; asking less often than the backend keeps its
  // place in line, it would lose that place between polls and be overtaken by every newcomer.
  if (waiterTimeout !== undefined && resolved.pollInterval >= waiterTimeout) {
    throw new InvalidLockOptionsError(
      'pollInterval',
      `DistributedLockModule: option 'pollInterval' (${resolved.pollInterval} ms${'pollInterval' in defined ? '' : ', the default'}) must be below ` +
        `the ${backend!.name} backend's waiterTimeout (${waiterTimeout} ms), or waiters lose their place in line between polls. ` +
        `Lower pollInterval, or raise waiterTimeout (well above pollInterval) in the backend's options.`,
    );
  }
  return resolved;
}
