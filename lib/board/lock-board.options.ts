import type { CanActivate, ModuleMetadata, Type } from '@nestjs/common';
import { check, type Check } from '../distributed-lock.options.js';
import { InvalidLockOptionsError } from '../lock.errors.js';

/** A guard as `@UseGuards()` takes it: a class (built by Nest, with its dependencies) or an instance. */
export type LockBoardGuard = CanActivate | Type<CanActivate>;

/** `LockBoardModule.forRoot()` options (docs/inspection.md). */
export interface LockBoardOptions {
  /** Where the page is served; its JSON and event stream live under it. Default '/locks'. */
  path?: string;
  /**
   * Applied to every route of the board (page, JSON, event stream, force release), after the
   * application's global guards. Use the app's own authentication: the board shows who holds what.
   */
  guard?: LockBoardGuard | LockBoardGuard[];
  /**
   * Modules whose providers a guard class needs (an auth module): Nest builds the guard in the
   * board's module, which sees only these and global modules.
   */
  imports?: ModuleMetadata['imports'];
  /**
   * Offer a "force release" button, which frees a key held by someone else (its holder learns at
   * its next extension). Off by default; only with a `guard`. Every use is logged.
   */
  forceRelease?: boolean;
  /** Who made a request, for the force-release log line. Default: `request.user`'s id, username, name or email, else 'anonymous'. */
  user?: (request: unknown) => string | undefined;
  /** How often the page refreshes while open, in ms. Default 1 000; a lock event of this process refreshes it sooner. */
  refreshMs?: number;
  /** At most this many keys on the page (1 to 1 000; a prefix narrows them). Default 100. */
  maxKeys?: number;
  /** How far back the contention counts go, in ms. Default 300 000 (5 minutes). */
  contentionWindowMs?: number;
}

/** The options with their defaults, as the board uses them. */
export interface ResolvedLockBoardOptions {
  path: string;
  guards: LockBoardGuard[];
  imports: NonNullable<ModuleMetadata['imports']>;
  forceRelease: boolean;
  user: (request: unknown) => string | undefined;
  refreshMs: number;
  maxKeys: number;
  contentionWindowMs: number;
}

/** @internal Injection token of the resolved options. */
export const LOCK_BOARD_OPTIONS = Symbol('LockBoardOptions');

const isGuard = (v: unknown): boolean =>
  typeof v === 'function' || (typeof v === 'object' && v !== null && typeof (v as CanActivate).canActivate === 'function');
const ms = (min: number, max: number): Check => [
  `a whole number of milliseconds from ${min} to ${max}`,
  (v) => Number.isInteger(v) && (v as number) >= min && (v as number) <= max,
];

const BOARD_OPTIONS: Record<string, Check> = {
  path: [
    "a URL path such as '/locks' (letters, digits, '-', '_', '.', '~' and '/')",
    (v) => typeof v === 'string' && /^\/?[\w.~-]+(\/[\w.~-]+)*\/?$/.test(v),
  ],
  guard: [
    'a guard class, a guard instance (with canActivate), or an array of them',
    (v) => (Array.isArray(v) ? v.length > 0 && v.every(isGuard) : isGuard(v)),
  ],
  imports: ['an array of modules', Array.isArray],
  forceRelease: ['true or false', (v) => typeof v === 'boolean'],
  user: ['a function (request) => string | undefined', (v) => typeof v === 'function'],
  refreshMs: ms(100, 60_000),
  maxKeys: ['an integer from 1 to 1000', (v) => Number.isInteger(v) && (v as number) >= 1 && (v as number) <= 1_000],
  contentionWindowMs: ms(1_000, 3_600_000),
};

/** The options checked, with their defaults; throws InvalidLockOptionsError saying what was wrong. */
export function resolveLockBoardOptions(options: LockBoardOptions | undefined): ResolvedLockBoardOptions {
  check(options, BOARD_OPTIONS, 'LockBoardModule.forRoot');
  const given = options ?? {};
  const guards = given.guard === undefined ? [] : Array.isArray(given.guard) ? given.guard : [given.guard];
  if (given.forceRelease && guards.length === 0) {
    throw new InvalidLockOptionsError(
      'forceRelease',
      "LockBoardModule.forRoot: 'forceRelease: true' needs a 'guard': whoever can open the board could free any lock. Pass the " +
        'guard your app authenticates operators with (guard: AdminGuard), or leave forceRelease off.',
    );
  }
  return {
    path: '/' + (given.path ?? 'locks').replace(/^\/+|\/+$/g, ''),
    guards,
    imports: given.imports ?? [],
    forceRelease: given.forceRelease ?? false,
    user: given.user ?? defaultUser,
    refreshMs: given.refreshMs ?? 1_000,
    maxKeys: given.maxKeys ?? 100,
    contentionWindowMs: given.contentionWindowMs ?? 300_000,
  };
}

/** `request.user` as Passport and most auth guards leave it: its first naming field. */
function defaultUser(request: unknown): string | undefined {
  const user = (request as { user?: unknown } | undefined)?.user;
  if (typeof user === 'string') return user;
  if (typeof user !== 'object' || user === null) return undefined;
  for (const field of ['username', 'name', 'email', 'id', 'sub']) {
    const value = (user as Record<string, unknown>)[field];
    if (typeof value === 'string' || typeof value === 'number') return String(value);
  }
  return undefined;
}
