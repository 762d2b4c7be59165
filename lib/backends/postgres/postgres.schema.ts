import { InvalidLockOptionsError } from '../../lock.errors.js';
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
    extend: name('_extend'),
    release: name('_release'),
  };
}

/**
 * Stored as the lock table's comment: the backend checks it on first use and creates what is
 * missing when it differs. A later version that changes the tables changes it too.
 */
export const SCHEMA_VERSION = 'nest-distributed-lock lock table, version 3';

/**
 * The greatest fencing token: Number.MAX_SAFE_INTEGER, the token sequence's MAXVALUE. Tokens reach
 * the application as JavaScript numbers, exact up to here.
 */
export const MAX_FENCING_TOKEN = Number.MAX_SAFE_INTEGER;

/**
 * The SQL that creates the lock tables, sequences and functions, for a migration of your own
 * (TypeORM, Prisma, Drizzle, Flyway, ...): run it once, and give the backend `createTables: false`
 * and the same `schema` and `table`. Safe to run again (it creates only what is missing, and
 * replaces the functions). Without a migration the backend runs the same SQL on first use.
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
 * The whole safety argument of the PostgreSQL backend is on this page: three functions, each one
 * statement from the client (one round trip), each one transaction.
 *
 * - Every function first takes a transaction-scoped advisory lock per key (`_lock_keys`), in one
 *   global order, so two calls on a key run one after the other and calls on several keys never
 *   deadlock. Each statement after it sees what the previous call on the key committed (READ
 *   COMMITTED takes a new snapshot per statement), so check-then-write is safe, as in a Lua
 *   script on Redis. The locks end with the transaction: nothing stays behind, and a pooler in
 *   transaction mode (pgbouncer) does not break them, unlike session advisory locks.
 * - Leases expire by the server's clock (`clock_timestamp()`, read after the key locks): a lease
 *   row is free once `expires_at` has passed, whether or not anyone deleted it.
 * - Fencing tokens come from one sequence: each acquisition takes the next value after every key
 *   is locked, so a token is greater than every earlier one of its keys, and a sequence never
 *   goes back across a restart or a crash (committed advances are in the WAL).
 * - Waiters stand in a line per key (`_waiters`, ordered by `place`, one number from a sequence
 *   per waiter, the same in each line it stands in). A free key goes to the first waiter that
 *   still has its place; a release tells only that waiter's process, by NOTIFY on the process's
 *   own channel (delivered when the release commits). A waiter that stops asking loses its place
 *   at its `deadline`.
 */
function tablesSql(schema: string, table: string): string {
  const n = lockNames(schema, table);
  const ms = (ts: string) => `ceil(extract(epoch FROM ${ts} - now_ts) * 1000)::bigint`;
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
-- One row per held (or expired, not yet reused) lease. Extensions update expires_at only, an
-- unindexed column: with room left on the page (fillfactor) they are HOT updates. Autovacuum
-- runs by row count rather than by table size: a small table with constant churn.
CREATE TABLE IF NOT EXISTS ${n.locks} (
  key text COLLATE "C" PRIMARY KEY,
  owner text NOT NULL,
  fencing_token bigint NOT NULL,
  expires_at timestamptz NOT NULL
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- One row per waiter and key it waits for: its place in the key's line, where to tell it that it
-- is its turn (its process's NOTIFY channel), when it loses its place unless it asks again, and
-- the lease a release hands it the lock with (0: a waiter for several keys, which is told and
-- asks again).
CREATE TABLE IF NOT EXISTS ${n.waiters} (
  key text COLLATE "C" NOT NULL,
  owner text NOT NULL,
  place bigint NOT NULL,
  channel text NOT NULL,
  deadline timestamptz NOT NULL,
  lease_ms integer NOT NULL DEFAULT 0,
  PRIMARY KEY (key, owner)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
-- Version 1 had no hand-over.
ALTER TABLE ${n.waiters} ADD COLUMN IF NOT EXISTS lease_ms integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS "${table}_waiters_line" ON ${n.waiters} (key, place);

-- Tokens stop at the largest integer a JavaScript number holds exactly: past it they would repeat
-- in the application (9007199254740992 + 1 reads as 9007199254740992). Reaching it is an error
-- that names the fix, rather than tokens that no longer increase.
CREATE SEQUENCE IF NOT EXISTS ${n.tokens} AS bigint MAXVALUE ${MAX_FENCING_TOKEN};
ALTER SEQUENCE ${n.tokens} MAXVALUE ${MAX_FENCING_TOKEN};
CREATE SEQUENCE IF NOT EXISTS ${n.places} AS bigint;

-- Serialises calls on the same keys until the end of the calling transaction; see above.
CREATE OR REPLACE FUNCTION ${n.lockKeys}(p_keys text[]) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  lock_id bigint;
BEGIN
  -- Under REPEATABLE READ or SERIALIZABLE a call would read a snapshot from before it waited for
  -- the key locks: refuse, instead of failing with serialization errors under contention.
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'nest-distributed-lock needs READ COMMITTED, got %', current_setting('transaction_isolation')
      USING HINT = 'Give the pool of the lock backend default_transaction_isolation = ''read committed''.';
  END IF;
  -- Hashed with the table's name: two lock tables do not hold each other up. A collision only
  -- makes two keys wait for each other for the length of one call.
  FOR lock_id IN
    SELECT DISTINCT hashtextextended('${n.qualified}:' || u.key, 0) FROM unnest(p_keys) AS u(key) ORDER BY 1
  LOOP
    PERFORM pg_advisory_xact_lock(lock_id);
  END LOOP;
END
$fn$;

-- Takes every key or none. A free key goes to the first waiter in its line: a process that
-- releases and asks again at once does not starve the others. A key this owner already holds (a
-- request resent after a timeout, or handed over by a release) is taken as it is. Returns the
-- fencing token; or when busy, the ms until a retry may succeed (the holder's remaining lease,
-- or the first waiter's place) and as token the last one handed out so far, after putting a
-- caller that will wait in line: a hand-over announced with a greater token came after this call.
CREATE OR REPLACE FUNCTION ${n.acquire}(
  p_keys text[], p_owner text, p_ttl_ms integer, p_waiter_timeout_ms integer, p_will_wait boolean, p_channel text,
  OUT acquired boolean, OUT token bigint, OUT retry_after_ms bigint
) LANGUAGE plpgsql AS $fn$
DECLARE
  now_ts timestamptz;
  k text;
  lease record;
  head record;
  mine text[] := '{}';
  kept_place bigint;
BEGIN
  PERFORM ${n.lockKeys}(p_keys);
  now_ts := clock_timestamp();
  FOREACH k IN ARRAY p_keys LOOP
    SELECT l.owner, l.expires_at INTO lease FROM ${n.locks} l WHERE l.key = k;
    IF FOUND AND lease.expires_at > now_ts THEN
      IF lease.owner = p_owner THEN
        mine := mine || k;
      ELSE
        retry_after_ms := greatest(retry_after_ms, ${ms('lease.expires_at')});
      END IF;
    END IF;
  END LOOP;
  IF retry_after_ms IS NULL THEN
    FOREACH k IN ARRAY p_keys LOOP
      CONTINUE WHEN k = ANY (mine);
      DELETE FROM ${n.waiters} w WHERE w.key = k AND w.deadline <= now_ts;
      SELECT w.owner, w.deadline INTO head FROM ${n.waiters} w WHERE w.key = k ORDER BY w.place LIMIT 1;
      IF FOUND AND head.owner <> p_owner THEN
        retry_after_ms := greatest(retry_after_ms, ${ms('head.deadline')});
      END IF;
    END LOOP;
  END IF;

  IF retry_after_ms IS NOT NULL THEN
    acquired := false;
    -- Read after the key locks: every hand-over of these keys before this call has a token at
    -- most this, every one after it a greater one.
    token := coalesce(pg_sequence_last_value('${n.tokens}'), 0);
    IF p_will_wait THEN
      -- One place per waiter, the same in all its lines: two waiters then stand in the same order
      -- in every line they share, so neither waits for the other on keys that are free. One that
      -- lost its place in any line takes a new one, at the back of all of them.
      SELECT CASE WHEN count(*) = cardinality(p_keys) AND min(w.place) = max(w.place) THEN min(w.place) END
        INTO kept_place
        FROM ${n.waiters} w WHERE w.key = ANY (p_keys) AND w.owner = p_owner AND w.deadline > now_ts;
      kept_place := coalesce(kept_place, nextval('${n.places}'));
      -- A waiter for one key is handed the lock on release, with its ttl but no longer than its
      -- place lasts, so one that died in line holds the others up that long at most.
      INSERT INTO ${n.waiters} AS w (key, owner, place, channel, deadline, lease_ms)
        SELECT u.key, p_owner, kept_place, p_channel, now_ts + p_waiter_timeout_ms * interval '1 millisecond',
               CASE WHEN cardinality(p_keys) = 1 THEN least(p_ttl_ms, p_waiter_timeout_ms) ELSE 0 END
          FROM unnest(p_keys) AS u(key)
        ON CONFLICT (key, owner) DO UPDATE
          SET place = excluded.place, channel = excluded.channel, deadline = excluded.deadline, lease_ms = excluded.lease_ms;
    END IF;
    RETURN;
  END IF;

  token := nextval('${n.tokens}');
  INSERT INTO ${n.locks} AS l (key, owner, fencing_token, expires_at)
    SELECT u.key, p_owner, token, now_ts + p_ttl_ms * interval '1 millisecond' FROM unnest(p_keys) AS u(key)
    ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, fencing_token = excluded.fencing_token, expires_at = excluded.expires_at;
  DELETE FROM ${n.waiters} w WHERE w.key = ANY (p_keys) AND w.owner = p_owner;
  acquired := true;
END
$fn$;

-- Resets the lease of every key if the owner still holds all of them; else changes nothing.
CREATE OR REPLACE FUNCTION ${n.extend}(p_keys text[], p_owner text, p_ttl_ms integer) RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  now_ts timestamptz;
BEGIN
  PERFORM ${n.lockKeys}(p_keys);
  now_ts := clock_timestamp();
  IF (SELECT count(*) FROM ${n.locks} l WHERE l.key = ANY (p_keys) AND l.owner = p_owner AND l.expires_at > now_ts)
     < cardinality(p_keys) THEN
    RETURN false;
  END IF;
  UPDATE ${n.locks} l SET expires_at = now_ts + p_ttl_ms * interval '1 millisecond' WHERE l.key = ANY (p_keys) AND l.owner = p_owner;
  RETURN true;
END
$fn$;

-- Compare-and-delete: frees the keys the owner still holds (a late release never frees another
-- owner's lock) and takes the owner out of their lines (a waiter that gives up). Then, if the key
-- is free, tells the first waiter's process, on its own channel: no other process hears it. A
-- waiter for one key is handed the lock right here, with a fencing token taken now, and told
-- '<owner> <token> <lease ms>': it enters without another round trip. A waiter for several keys
-- is told '<owner>' and asks again. Returns how many unexpired leases the owner held.
CREATE OR REPLACE FUNCTION ${n.release}(p_keys text[], p_owner text) RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
  now_ts timestamptz;
  k text;
  expired_at timestamptz;
  held boolean;
  waited boolean;
  released integer := 0;
  head record;
  has_head boolean;
  handed bigint;
BEGIN
  PERFORM ${n.lockKeys}(p_keys);
  now_ts := clock_timestamp();
  FOREACH k IN ARRAY p_keys LOOP
    DELETE FROM ${n.locks} l WHERE l.key = k AND l.owner = p_owner RETURNING l.expires_at INTO expired_at;
    held := FOUND;
    IF held AND expired_at > now_ts THEN
      released := released + 1;
    END IF;
    DELETE FROM ${n.waiters} w WHERE w.key = k AND w.owner = p_owner;
    waited := FOUND;
    IF held OR (waited AND NOT EXISTS (SELECT 1 FROM ${n.locks} l WHERE l.key = k AND l.expires_at > now_ts)) THEN
      DELETE FROM ${n.waiters} w WHERE w.key = k AND w.deadline <= now_ts;
      SELECT w.owner, w.channel, w.lease_ms INTO head FROM ${n.waiters} w WHERE w.key = k ORDER BY w.place LIMIT 1;
      has_head := FOUND;
      handed := NULL;
      IF has_head AND head.lease_ms > 0 AND NOT EXISTS (SELECT 1 FROM ${n.locks} l WHERE l.key = k AND l.expires_at > now_ts) THEN
        -- Without a token left, the release still frees the key: the waiter is only told, and its
        -- own acquire then fails with the error that names the fix.
        BEGIN
          handed := nextval('${n.tokens}');
        EXCEPTION WHEN sequence_generator_limit_exceeded THEN
          handed := NULL;
        END;
      END IF;
      IF handed IS NOT NULL THEN
        INSERT INTO ${n.locks} AS l (key, owner, fencing_token, expires_at)
          VALUES (k, head.owner, handed, now_ts + head.lease_ms * interval '1 millisecond')
          ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, fencing_token = excluded.fencing_token, expires_at = excluded.expires_at;
        DELETE FROM ${n.waiters} w WHERE w.key = k AND w.owner = head.owner;
        -- Sent when this transaction commits.
        PERFORM pg_notify(head.channel, head.owner || ' ' || handed || ' ' || head.lease_ms);
      ELSIF has_head THEN
        -- Sent when this transaction commits; the same message twice in it is sent once.
        PERFORM pg_notify(head.channel, head.owner);
      END IF;
    END IF;
  END LOOP;
  RETURN released;
END
$fn$;

COMMENT ON TABLE ${n.locks} IS '${SCHEMA_VERSION}';
`;
}
