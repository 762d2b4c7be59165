/** Where the shop keeps its locks (LOCK_BACKEND). */
export const LOCK_BACKENDS = ['memory', 'redis', 'redlock', 'postgres', 'mysql'] as const;
export type LockBackendKind = (typeof LOCK_BACKENDS)[number];

/** The shop's database, from DATABASE_URL's scheme: each has its own SQL (see products.repository.ts). */
export type DatabaseKind = 'pglite' | 'postgres' | 'mysql';

/** Everything the shop reads from its environment, read once at start-up. */
export interface ShopConfig {
  /**
   * PostgreSQL through `pg` (`postgres://`, `postgresql://`), or MySQL / MariaDB through `mysql2`
   * (`mysql://`, `mariadb://`); unset: an embedded PostgreSQL (PGlite) in memory.
   */
  databaseUrl?: string;
  /** One Redis for the locks; unset (and no REDLOCK_URLS): in-process locks. */
  redisUrl?: string;
  /** Several independent Redis masters for Redlock, comma-separated. */
  redlockUrls?: string[];
  /**
   * Where the locks are kept. Unset: Redlock with REDLOCK_URLS, else Redis with REDIS_URL, else
   * in-process. `postgres` and `mysql` keep them in the shop's own database (DATABASE_URL, of
   * that kind): no Redis at all.
   */
  lockBackend?: LockBackendKind;
  /** Lease of the product locks in ms (default: the module's 30 s). */
  lockTtlMs?: number;
  /** Whether the watchdog extends held leases (default true). Tests switch it off to let a lease lapse. */
  lockAutoExtend?: boolean;
  /**
   * Serve `POST /demo`, the page's "Run the demo" button (default off). It needs no credentials and
   * makes this process send itself thousands of requests: a demo for your own machine, not a route
   * to leave open.
   */
  demo?: boolean;
}

export function configFromEnv(env: NodeJS.ProcessEnv = process.env): ShopConfig {
  const config: ShopConfig = {
    databaseUrl: env.DATABASE_URL || undefined,
    redisUrl: env.REDIS_URL || undefined,
    redlockUrls: env.REDLOCK_URLS
      ? env.REDLOCK_URLS.split(',')
          .map((url) => url.trim())
          .filter(Boolean)
      : undefined,
    lockBackend: lockBackendFromEnv(env.LOCK_BACKEND),
    lockTtlMs: env.LOCK_TTL_MS ? positive('LOCK_TTL_MS', env.LOCK_TTL_MS) : undefined,
    lockAutoExtend: env.LOCK_AUTO_EXTEND ? env.LOCK_AUTO_EXTEND !== 'false' : undefined,
    demo: onOff('SHOP_DEMO', env.SHOP_DEMO),
  };
  checkLockBackend(config);
  return config;
}

/** Which database DATABASE_URL names; a scheme the shop has no SQL for is refused at start-up. */
export function databaseKind(config: ShopConfig): DatabaseKind {
  if (!config.databaseUrl) return 'pglite';
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(config.databaseUrl.trim())?.[1]?.toLowerCase();
  if (scheme === 'postgres' || scheme === 'postgresql') return 'postgres';
  if (scheme === 'mysql' || scheme === 'mariadb') return 'mysql';
  throw new Error(
    `DATABASE_URL must start with postgres:// or postgresql:// (PostgreSQL) or mysql:// or mariadb:// (MySQL or MariaDB), got ${scheme ? `'${scheme}:...'` : 'no scheme'}.`,
  );
}

/** The lock backend asked for, or inferred from the URLs that are set. */
export function lockBackendKind(config: ShopConfig): LockBackendKind {
  if (config.lockBackend) return config.lockBackend;
  if (config.redlockUrls) return 'redlock';
  if (config.redisUrl) return 'redis';
  return 'memory';
}

function lockBackendFromEnv(value: string | undefined): LockBackendKind | undefined {
  const normalized = (value ?? '').trim().toLowerCase();
  if (normalized === '') return undefined;
  if ((LOCK_BACKENDS as readonly string[]).includes(normalized)) return normalized as LockBackendKind;
  throw new Error(
    `LOCK_BACKEND must be one of ${LOCK_BACKENDS.join(', ')} (unset: redlock with REDLOCK_URLS, else redis with REDIS_URL, else memory), got '${value}'.`,
  );
}

/** A backend asked for by name needs its server: say which variable is missing rather than fall back. */
export function checkLockBackend(config: ShopConfig): void {
  const needs: Partial<Record<LockBackendKind, [keyof ShopConfig, string]>> = {
    postgres: [
      'databaseUrl',
      "DATABASE_URL (the shop's PostgreSQL, which then holds the locks too; the embedded PGlite serves one process only)",
    ],
    mysql: [
      'databaseUrl',
      "DATABASE_URL (the shop's MySQL or MariaDB, mysql://user:password@host:3306/shop, which then holds the locks too)",
    ],
    redis: ['redisUrl', 'REDIS_URL'],
    redlock: ['redlockUrls', 'REDLOCK_URLS (comma-separated Redis masters)'],
  };
  const need = config.lockBackend && needs[config.lockBackend];
  if (need && !config[need[0]]) throw new Error(`LOCK_BACKEND=${config.lockBackend} needs ${need[1]}, which is not set.`);
  // The database locks live in the shop's own database (checked above to be set): of their kind.
  const database = databaseKind(config);
  if ((config.lockBackend === 'postgres' || config.lockBackend === 'mysql') && database !== config.lockBackend) {
    throw new Error(
      `LOCK_BACKEND=${config.lockBackend} keeps the locks in the shop's database, so DATABASE_URL must be a ${DATABASE_SCHEMES[config.lockBackend]} URL; it is a ${DATABASE_SCHEMES[database]} one.`,
    );
  }
}

const DATABASE_SCHEMES: Record<DatabaseKind, string> = { pglite: 'PGlite', postgres: 'postgres://', mysql: 'mysql:// or mariadb://' };

/** A switch that opens a route is read strictly: a typo must not leave it on, or silently off. */
function onOff(name: string, value: string | undefined): boolean {
  const normalized = (value ?? '').trim().toLowerCase();
  if (['on', 'true', '1'].includes(normalized)) return true;
  if (['', 'off', 'false', '0'].includes(normalized)) return false;
  throw new Error(`${name} must be 'on' or 'off' (unset: off), got '${value}'.`);
}

function positive(name: string, value: string): number {
  const number = Number(value);
  if (!Number.isInteger(number) || number <= 0) throw new Error(`${name} must be a positive integer (milliseconds), got '${value}'.`);
  return number;
}

/** For logs: which database and lock backend this process uses, without credentials. */
export function describeConfig(config: ShopConfig): string {
  const database = {
    pglite: () => 'embedded PostgreSQL (PGlite, in memory)',
    postgres: () => `PostgreSQL at ${redact(config.databaseUrl!)}`,
    mysql: () => `MySQL at ${redact(config.databaseUrl!)}`,
  }[databaseKind(config)]();
  const locks = {
    redlock: () => `Redlock over ${config.redlockUrls!.length} Redis masters`,
    redis: () => `Redis at ${redact(config.redisUrl!)}`,
    postgres: () => 'locks in that PostgreSQL (PostgresLockBackend)',
    mysql: () => 'locks in that MySQL (MysqlLockBackend)',
    memory: () => 'in-process locks (one process only)',
  }[lockBackendKind(config)]();
  return `${database}; ${locks}${config.demo ? '; POST /demo on (SHOP_DEMO)' : ''}`;
}

function redact(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    // ioredis, pg and mysql2 also take the password as a query parameter.
    if (parsed.searchParams.has('password')) parsed.searchParams.set('password', '***');
    return parsed.toString();
  } catch {
    return '(unparsable URL)';
  }
}
