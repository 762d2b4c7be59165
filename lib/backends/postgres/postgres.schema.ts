import { InvalidLockOptionsError } from '../../lock.errors.js';
import { functionsSql, OLDER_RELEASE_GUARD } from './postgres.functions.js';
import { resolveBackendOptions } from './postgres.options.js';

/**
 * The names the backend uses in SQL, schema-qualified and quoted. `schema` and `table` are
 * checked names (lower-case letters, digits, `_`), so quoting needs no escaping.
 */
export interface PostgresLockNames {
  /** `schema.table` as `to_regclass` and messages take it. */
  readonly qualified: string;
  /** The schema, unquoted. */
  readonly schema: string;
  readonly locks: string;
  readonly waiters: string;
  readonly tokens: string;
  readonly places: string;
  readonly lockKeys: string;
  readonly acquire: string;
  readonly admit: string;
  readonly extend: string;
  readonly release: string;
}

export function lockNames(schema: string, table: string): PostgresLockNames {
  const name = (suffix: string) => `"${schema}"."${table}${suffix}"`;
  return {
    qualified: `${schema}.${table}`,
    schema,
    locks: name(''),
    waiters: name('_waiters'),
    tokens: name('_fencing_tokens'),
    places: name('_waiter_places'),
    lockKeys: name('_lock_keys'),
    acquire: name('_acquire'),
    admit: name('_admit'),
    extend: name('_extend'),
    release: name('_release'),
  };
}

/**
 * The version of the tables' layout this release reads and writes (see SCHEMA_VERSION). The
 * columns of who holds and waits (IDENTITY_COLUMN) came within version 4: releases before them
 * run on tables that have them, so they did not change the version, which those releases would
 * refuse.
 */
export const SCHEMA_LAYOUT = 4;

/** A column this release needs that tables of version 4 made by an earlier release lack. */
export const IDENTITY_COLUMN = 'acquired_at';

/**
 * Stored as the lock table's comment: the backend checks it on first use, brings older tables to
 * this version, and refuses tables of a later one. A later version that changes the tables
 * changes it too.
 */
export const SCHEMA_VERSION = `nest-distributed-lock lock table, version ${SCHEMA_LAYOUT}`;

/** The acquire function whose body names FUNCTIONS_REVISION, as `to_regprocedure` takes it. */
export function acquireSignature(n: PostgresLockNames): string {
  return `${n.acquire}(text[], text, integer, integer, boolean, text, double precision[], text)`;
}

/** The layout a version comment names, or undefined when it is not one of ours. */
export function schemaLayout(comment: unknown): number | undefined {
  const match = typeof comment === 'string' ? /^nest-distributed-lock lock table, version (\d+)$/.exec(comment) : null;
  return match ? Number(match[1]) : undefined;
}

/**
 * Tables of a later version were made by a newer release, whose rules (who may hold a key beside
 * whom) this one does not know: taking keys there, or putting this version's functions back,
 * could let two processes hold one key. Says so, for a version comment of a later layout.
 */
export function newerLayoutRefusal(comment: unknown, qualified: string): string | undefined {
  const layout = schemaLayout(comment);
  if (layout === undefined || layout <= SCHEMA_LAYOUT) return undefined;
  return (
    `the lock table ${qualified} is at version ${layout}, made by a newer release of nest-distributed-lock than this one ` +
    `(version ${SCHEMA_LAYOUT}): update nest-distributed-lock in this application, as every process that locks through ` +
    `one table must run a release that knows its version.`
  );
}

/**
 * The greatest fencing token: Number.MAX_SAFE_INTEGER, the token sequence's MAXVALUE. Tokens reach
 * the application as JavaScript numbers, exact up to here.
 */
export const MAX_FENCING_TOKEN = Number.MAX_SAFE_INTEGER;

/**
 * The SQL that creates the lock tables, sequences and functions, for a migration of your own
 * (TypeORM, Prisma, Drizzle, Flyway, ...): run it once, and give the backend `createTables: false`
 * and the same `schema` and `table`. Safe to run again (it creates only what is missing, brings
 * tables of an earlier version to this one in place, and replaces the functions). Without a
 * migration the backend runs the same SQL on first use.
 */
export function postgresLockTablesSql(options?: { schema?: string; table?: string }): string {
  if (options !== undefined && (typeof options !== 'object' || options === null)) {
    throw new InvalidLockOptionsError('(options)', `postgresLockTablesSql: options must be { schema?, table? }, got ${String(options)}.`);
  }
  for (const name of Object.keys(options ?? {})) {
    if (name !== 'schema' && name !== 'table') {
      throw new InvalidLockOptionsError(name, `postgresLockTablesSql: unknown option '${name}'. Accepted options: schema, table.`);
    }
  }
  const { schema, table } = resolveBackendOptions(options);
  return tablesSql(schema, table);
}

/**
 * The tables, sequences and functions (see postgres.functions.ts for the functions and the safety
 * argument), and the steps that bring the tables of an earlier version to this one in place.
 */
function tablesSql(schema: string, table: string): string {
  const n = lockNames(schema, table);
  // Not CREATE SCHEMA IF NOT EXISTS: it needs CREATE on the database even when the schema exists,
  // which a role that was given its own schema (CREATE SCHEMA ... AUTHORIZATION) does not have.
  const createSchema = `DO $schema$ BEGIN
  IF to_regnamespace('"${schema}"') IS NULL THEN
    CREATE SCHEMA "${schema}";
  END IF;
END
$schema$;
`;
  return `${schema === 'public' ? '' : createSchema}
-- One row per holder of a key (or expired lease, not yet deleted): several for a shared lock or a
-- semaphore, each with its own lease, and the limit it holds with (max_holders: 1 exclusive, n
-- permits, 'Infinity' shared). Extensions update expires_at only, an unindexed column: with room
-- left on the page (fillfactor) they are HOT updates. Autovacuum runs by row count rather than by
-- table size: a small table with constant churn.
CREATE TABLE IF NOT EXISTS ${n.locks} (
  key text COLLATE "C" NOT NULL,
  owner text NOT NULL,
  fencing_token bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  max_holders double precision NOT NULL DEFAULT 1,
  holder text,
  acquired_at timestamptz,
  PRIMARY KEY (key, owner)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
-- Version 3 and earlier: one holder per key (primary key on key alone), no limit.
ALTER TABLE ${n.locks} ADD COLUMN IF NOT EXISTS max_holders double precision NOT NULL DEFAULT 1;
DO $key$
DECLARE
  pk record;
BEGIN
  SELECT c.conname, cardinality(c.conkey) AS columns INTO pk
    FROM pg_constraint c WHERE c.conrelid = '${n.locks}'::regclass AND c.contype = 'p';
  IF pk.columns = 1 THEN
    EXECUTE format('ALTER TABLE ${n.locks} DROP CONSTRAINT %I, ADD PRIMARY KEY (key, owner)', pk.conname);
  END IF;
END
$key$;

-- One row per waiter and key it waits for: its place in the key's line, where to tell it that it
-- is its turn (its process's NOTIFY channel), when it loses its place unless it asks again, the
-- lease a release hands it the lock with (0: a waiter for several keys, which is told and asks
-- again), and its limit.
CREATE TABLE IF NOT EXISTS ${n.waiters} (
  key text COLLATE "C" NOT NULL,
  owner text NOT NULL,
  place bigint NOT NULL,
  channel text NOT NULL,
  deadline timestamptz NOT NULL,
  lease_ms integer NOT NULL DEFAULT 0,
  max_holders double precision NOT NULL DEFAULT 1,
  holder text,
  since timestamptz,
  PRIMARY KEY (key, owner)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
-- Version 1 had no hand-over; version 3 and earlier no limit.
ALTER TABLE ${n.waiters} ADD COLUMN IF NOT EXISTS lease_ms integer NOT NULL DEFAULT 0;
ALTER TABLE ${n.waiters} ADD COLUMN IF NOT EXISTS max_holders double precision NOT NULL DEFAULT 1;
CREATE INDEX IF NOT EXISTS "${table}_waiters_line" ON ${n.waiters} (key, place);
-- Who holds and waits, for inspect (docs/inspection.md): '<instance>' || E'\\n' || '<site>', when the
-- lease was taken and when the place in line was. Nullable columns without a default: adding them
-- rewrites nothing, and releases before this one neither write nor read them, so they run on
-- these tables unchanged (a rolling upgrade, or a rollback).
ALTER TABLE ${n.locks} ADD COLUMN IF NOT EXISTS holder text;
ALTER TABLE ${n.locks} ADD COLUMN IF NOT EXISTS acquired_at timestamptz;
ALTER TABLE ${n.waiters} ADD COLUMN IF NOT EXISTS holder text;
ALTER TABLE ${n.waiters} ADD COLUMN IF NOT EXISTS since timestamptz;

-- Tokens stop at the largest integer a JavaScript number holds exactly: past it they would repeat
-- in the application (9007199254740992 + 1 reads as 9007199254740992). Reaching it is an error
-- that names the fix, rather than tokens that no longer increase.
CREATE SEQUENCE IF NOT EXISTS ${n.tokens} AS bigint MAXVALUE ${MAX_FENCING_TOKEN};
ALTER SEQUENCE ${n.tokens} MAXVALUE ${MAX_FENCING_TOKEN};
CREATE SEQUENCE IF NOT EXISTS ${n.places} AS bigint;

-- Version 3 and earlier named the key-locking function's parameter p_keys; this version's name is
-- the message an older release reads if it starts here and tries to put its own functions back.
DO $guard$ BEGIN
  IF (SELECT p.proargnames[1] FROM pg_proc p WHERE p.oid = to_regprocedure('${n.lockKeys}(text[])')) <> '${OLDER_RELEASE_GUARD}' THEN
    DROP FUNCTION ${n.lockKeys}(text[]);
  END IF;
END
$guard$;
${functionsSql(n)}
COMMENT ON TABLE ${n.locks} IS '${SCHEMA_VERSION}';
`;
}
