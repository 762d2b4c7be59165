/** Everything the shop reads from its environment, read once at start-up. */
export interface ShopConfig {
  /** PostgreSQL through `pg`; unset: an embedded PostgreSQL (PGlite) in memory. */
  databaseUrl?: string;
  /** One Redis for the locks; unset (and no REDLOCK_URLS): in-process locks. */
  redisUrl?: string;
  /** Several independent Redis masters for Redlock, comma-separated. */
  redlockUrls?: string[];
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
  return {
    databaseUrl: env.DATABASE_URL || undefined,
    redisUrl: env.REDIS_URL || undefined,
    redlockUrls: env.REDLOCK_URLS
      ? env.REDLOCK_URLS.split(',')
          .map((url) => url.trim())
          .filter(Boolean)
      : undefined,
    lockTtlMs: env.LOCK_TTL_MS ? positive('LOCK_TTL_MS', env.LOCK_TTL_MS) : undefined,
    lockAutoExtend: env.LOCK_AUTO_EXTEND ? env.LOCK_AUTO_EXTEND !== 'false' : undefined,
    demo: onOff('SHOP_DEMO', env.SHOP_DEMO),
  };
}

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
  const database = config.databaseUrl ? `PostgreSQL at ${redact(config.databaseUrl)}` : 'embedded PostgreSQL (PGlite, in memory)';
  const locks = config.redlockUrls
    ? `Redlock over ${config.redlockUrls.length} Redis masters`
    : config.redisUrl
      ? `Redis at ${redact(config.redisUrl)}`
      : 'in-process locks (one process only)';
  return `${database}; ${locks}${config.demo ? '; POST /demo on (SHOP_DEMO)' : ''}`;
}

function redact(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    // ioredis and pg also take the password as a query parameter.
    if (parsed.searchParams.has('password')) parsed.searchParams.set('password', '***');
    return parsed.toString();
  } catch {
    return '(unparsable URL)';
  }
}
