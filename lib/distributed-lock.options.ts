import type { LockBackend } from './backends/lock-backend.interface.js';
import { InvalidLockOptionsError } from './lock.errors.js';

/** Options for one acquisition (LockService) or one decorated method (@Locked). */
export interface LockOptions {
  /** Lease in milliseconds; extended by the watchdog while the holder runs. Default: module `ttl`. */
  ttl?: number;
  /** How long to wait for a held lock, in milliseconds; 0 tries once. Default: module `wait`. */
  wait?: number;
  /** Extend the lease about every ttl/3 while held. Default: module `autoExtend` (true). */
  autoExtend?: boolean;
}

/** What a busy lock does to a `using()` call or a @Locked method. */
export type OnBusy = 'throw' | 'skip';

export interface UsingOptions extends LockOptions {
  /** 'throw' (default) raises LockNotAcquiredError; 'skip' returns undefined without running. */
  onBusy?: OnBusy;
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
}

export type ResolvedModuleOptions = Required<Omit<DistributedLockModuleOptions, 'backend'>>;

export const MODULE_DEFAULTS: ResolvedModuleOptions = {
  keyPrefix: 'lock:',
  ttl: 30_000,
  wait: 10_000,
  autoExtend: true,
  pollInterval: 500,
  maxKeyLength: 512,
};

type Check = [accepts: string, ok: (value: unknown) => boolean];

const positiveMs: Check = ['a positive finite number of milliseconds', (v) => typeof v === 'number' && Number.isFinite(v) && v > 0];
const waitMs: Check = ['0 (try once) or a positive finite number of milliseconds', (v) => typeof v === 'number' && Number.isFinite(v) && v >= 0];
const bool: Check = ['true or false', (v) => typeof v === 'boolean'];

const LOCK_OPTIONS: Record<string, Check> = { ttl: positiveMs, wait: waitMs, autoExtend: bool };
const USING_OPTIONS: Record<string, Check> = {
  ...LOCK_OPTIONS,
  onBusy: ["'throw' or 'skip'", (v) => v === 'throw' || v === 'skip'],
};
const ACQUIRE_OPTIONS: Record<string, Check> = {
  ...LOCK_OPTIONS,
  signal: ['an AbortSignal', (v) => v instanceof AbortSignal],
};
const MODULE_OPTIONS: Record<string, Check> = {
  ...LOCK_OPTIONS,
  backend: [
    'an object implementing LockBackend (tryAcquire, extend, release, inspect)',
    (v) =>
      typeof v === 'object' && v !== null &&
      ['tryAcquire', 'extend', 'release', 'inspect'].every((m) => typeof (v as Record<string, unknown>)[m] === 'function'),
  ],
  keyPrefix: ['a string (may be empty)', (v) => typeof v === 'string'],
  pollInterval: positiveMs,
  maxKeyLength: ['a positive integer', (v) => Number.isInteger(v) && (v as number) > 0],
};

function check(options: unknown, checks: Record<string, Check>, where: string): void {
  if (options === undefined) return;
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new InvalidLockOptionsError('(options)', `${where}: options must be an object, got ${String(options)}.`);
  }
  for (const name of Object.keys(options)) {
    const value = (options as Record<string, unknown>)[name];
    const rule = checks[name];
    if (!rule) {
      throw new InvalidLockOptionsError(
        name,
        `${where}: unknown option '${name}'. Accepted options: ${Object.keys(checks).join(', ')}.`,
      );
    }
    if (value === undefined) continue;
    const [accepts, ok] = rule;
    if (!ok(value)) {
      throw new InvalidLockOptionsError(name, `${where}: option '${name}' must be ${accepts}, got ${show(value)}.`);
    }
  }
}

function show(value: unknown): string {
  if (typeof value === 'string') return `'${value}'`;
  if (typeof value === 'object' && value !== null) return Array.isArray(value) ? 'an array' : 'an object';
  return String(value);
}

export function checkLockOptions(options: unknown, where: string): void {
  check(options, LOCK_OPTIONS, where);
}
export function checkUsingOptions(options: unknown, where: string): void {
  check(options, USING_OPTIONS, where);
}
export function checkAcquireOptions(options: unknown, where: string): void {
  check(options, ACQUIRE_OPTIONS, where);
}

/** Checks module options at start-up and fills in the defaults. */
export function resolveModuleOptions(options: DistributedLockModuleOptions | undefined): ResolvedModuleOptions {
  check(options, MODULE_OPTIONS, 'DistributedLockModule');
  const defined = Object.fromEntries(
    Object.entries(options ?? {}).filter(([name, value]) => name !== 'backend' && value !== undefined),
  );
  return { ...MODULE_DEFAULTS, ...defined };
}
