import type { PostgresLockNames } from './postgres.schema.js';

/**
 * A line of the acquire function's body: the functions change within a version of the tables when
 * their rules do (revision 2: a waiter for several keys stands in line only up to the first key
 * that keeps it out). The backend puts them back when the tables are at this version but the body
 * lacks this line: functions of an earlier revision, or none (before revision 2). In the body, not
 * in a comment on the function, which PostgreSQL keeps when an earlier release's SQL, run again
 * (a rollback), replaces the body with its own.
 */
export const FUNCTIONS_REVISION = 'nest-distributed-lock functions, revision 4';

/**
 * Revisions 3 (one key locked without the nested call, lines read once before they are written)
 * and 4 (a waiter for one key counts its places with a plan made once per connection) keep every
 * rule of revision 2: the body names the revisions it includes, so a process of any of them finds
 * the functions current and leaves them in place.
 */
const INCLUDED_REVISIONS = ['nest-distributed-lock functions, revision 3', 'nest-distributed-lock functions, revision 2'];

/**
 * The name of the key-locking function's parameter, and the message a process of an older release
 * reads when it starts on tables of this version: its own SQL redefines the function with the
 * parameter `p_keys`, which PostgreSQL refuses with "cannot change name of input parameter
 * "<this>"", so it cannot put back functions that know nothing of shared holders. At most 63 bytes
 * (PostgreSQL's longest name).
 */
export const OLDER_RELEASE_GUARD = 'lock tables at version 4: update nest-distributed-lock';

/**
 * The PL/pgSQL functions, each one statement from the client (one round trip), each one
 * transaction. The safety argument of the whole backend is on this page:
 *
 * - Every function first takes a transaction-scoped advisory lock per key (`_lock_keys`; a call of
 *   one key takes the same lock inline, see lockKeysSql), in one global order, so two calls on a
 *   key run one after the other and calls on several keys never deadlock. Each statement after it sees what the previous call on the key committed (READ
 *   COMMITTED takes a new snapshot per statement), so check-then-write is safe, as in a Lua
 *   script on Redis. The locks end with the transaction: nothing stays behind, and a pooler in
 *   transaction mode (pgbouncer) does not break them, unlike session advisory locks.
 * - A key has a row per holder (primary key (key, owner)), each with its own lease, expiring by
 *   the server's clock (`clock_timestamp()`, read after the key locks): a lease row is free once
 *   `expires_at` has passed, whether or not anyone deleted it. `max_holders` is the holder's limit:
 *   1 exclusive, n a semaphore of n permits, 'Infinity' shared (read).
 * - A caller with limit L enters a key when nobody is ahead of it in the key's line and the key has
 *   fewer live holders than L and than every holder's limit. Limits above 1 that differ are a
 *   mismatch, reported and never waited for.
 * - Fencing tokens come from one sequence for every mode: each acquisition or hand-over takes the
 *   next value after its keys are locked, so a token is greater than every earlier one of its
 *   keys, and a sequence never goes back across a restart or a crash.
 * - Waiters stand in a line per key (`_waiters`, ordered by `place`). A waiter for several keys
 *   stands in the lines of its keys up to the first that keeps it out, none after it, and keeps
 *   the place it has in a line as it moves on to the next. `_admit` lets in, from the head,
 *   exactly the waiters that can enter now, and stops at the first that cannot, so nobody passes
 *   it: a waiter for one key is handed the key there, a waiter for several is told and asks again.
 *   Each is told by NOTIFY on its own process's channel (delivered at commit); nobody else is
 *   woken.
 */
export function functionsSql(n: PostgresLockNames): string {
  const ms = (ts: string) => `ceil(extract(epoch FROM ${ts} - now_ts) * 1000)::bigint`;
  const lockKeys = lockKeysSql(n);
  return `
-- Serialises calls on the same keys until the end of the calling transaction; see above. Its
-- parameter's name is the message an older release reads (see OLDER_RELEASE_GUARD).
CREATE OR REPLACE FUNCTION ${n.lockKeys}("${OLDER_RELEASE_GUARD}" text[]) RETURNS void LANGUAGE plpgsql AS $fn$
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
    SELECT DISTINCT hashtextextended('${n.qualified}:' || u.key, 0) FROM unnest($1) AS u(key) ORDER BY 1
  LOOP
    PERFORM pg_advisory_xact_lock(lock_id);
  END LOOP;
END
$fn$;

-- Takes every key or none, each with its limit (p_limits aligned with p_keys; NULL: all 1). A key
-- this owner already holds (a request resent after a timeout, or handed over by a release) is
-- taken as it is. Returns the fencing token; or when busy, the ms until a retry may succeed (the
-- lease that must end first, or the first waiter's place) and as token the last one handed out
-- so far, after putting a caller that will wait in line: a hand-over announced with a greater
-- token came after this call. A limit mismatch returns the key and its holders' limit, and
-- leaves the line alone. p_holder is who asks ('<instance>' || E'\\n' || '<site>'), stored with the
-- lease or the place in line for inspect, never read here.
CREATE OR REPLACE FUNCTION ${n.acquire}(
  p_keys text[], p_owner text, p_ttl_ms integer, p_waiter_timeout_ms integer, p_will_wait boolean, p_channel text,
  p_limits double precision[], p_holder text,
  OUT acquired boolean, OUT token bigint, OUT retry_after_ms bigint, OUT mismatch_key text, OUT mismatch_limit double precision
) LANGUAGE plpgsql SET enable_bitmapscan = off SET enable_seqscan = off AS $fn$
-- ${FUNCTIONS_REVISION}
${INCLUDED_REVISIONS.map((revision) => `-- ${revision}`).join('\n')}
DECLARE
  now_ts timestamptz;
  i integer;
  k text;
  lim double precision;
  held record;
  head record;
  mine text[] := '{}';
  left_line integer := 0;
  kept_place bigint;
  blocked integer;
  in_line boolean := false;
BEGIN
  ${lockKeys}
  now_ts := clock_timestamp();
  FOR i IN 1 .. cardinality(p_keys) LOOP
    k := p_keys[i];
    lim := coalesce(p_limits[i], 1);
    IF lim = 1 THEN
      -- Exclusive: any other live holder is in the way, and it waits for the last lease to end.
      SELECT bool_or(l.owner = p_owner) AS mine, max(l.expires_at) FILTER (WHERE l.owner <> p_owner) AS last_end
        INTO held FROM ${n.locks} l WHERE l.key = k AND l.expires_at > now_ts;
      IF held.mine THEN
        mine := mine || k;
      ELSIF held.last_end IS NOT NULL THEN
        retry_after_ms := greatest(retry_after_ms, ${ms('held.last_end')});
        blocked := coalesce(blocked, i);
      END IF;
      CONTINUE;
    END IF;
    SELECT count(*) AS holders, bool_or(l.owner = p_owner) AS mine, min(l.max_holders) AS least_limit,
           max(l.max_holders) FILTER (WHERE l.max_holders > 1) AS shared_limit,
           min(l.expires_at) AS first_end, max(l.expires_at) AS last_end
      INTO held FROM ${n.locks} l WHERE l.key = k AND l.expires_at > now_ts;
    IF held.mine THEN
      mine := mine || k;
    ELSIF held.shared_limit <> lim THEN
      acquired := false;
      mismatch_key := k;
      mismatch_limit := held.shared_limit;
      RETURN;
    ELSIF held.holders >= least(lim, held.least_limit) THEN
      -- Behind an exclusive holder it waits for its lease; among several, for the first to end.
      retry_after_ms := greatest(retry_after_ms, ${ms('CASE WHEN held.least_limit = 1 THEN held.last_end ELSE held.first_end END')});
      blocked := coalesce(blocked, i);
    END IF;
  END LOOP;
  -- Without a held key every line decides; with one, only the lines before it: one of them may
  -- keep the caller out sooner.
  FOR i IN 1 .. coalesce(blocked - 1, cardinality(p_keys)) LOOP
    k := p_keys[i];
    CONTINUE WHEN k = ANY (mine);
    -- Read first: most lines are empty, and then there is nothing to delete.
    SELECT w.owner, w.deadline INTO head FROM ${n.waiters} w WHERE w.key = k ORDER BY w.place LIMIT 1;
    IF FOUND AND head.deadline <= now_ts THEN
      DELETE FROM ${n.waiters} w WHERE w.key = k AND w.deadline <= now_ts;
      SELECT w.owner, w.deadline INTO head FROM ${n.waiters} w WHERE w.key = k ORDER BY w.place LIMIT 1;
    END IF;
    in_line := in_line OR FOUND;
    IF FOUND AND head.owner <> p_owner THEN
      retry_after_ms := greatest(retry_after_ms, ${ms('head.deadline')});
      IF blocked IS NOT NULL AND blocked > i OR blocked IS NULL THEN
        blocked := i;
      END IF;
    END IF;
  END LOOP;

  IF retry_after_ms IS NOT NULL THEN
    acquired := false;
    -- Read after the key locks: every hand-over of these keys before this call has a token at
    -- most this, every one after it a greater one.
    token := coalesce(pg_sequence_last_value('${n.tokens}'), 0);
    IF p_will_wait THEN
      -- A place in line up to the first key that keeps it out, none after it: a place in the line
      -- of a later key would keep that key from a holder of an earlier one that takes it next
      -- (sorted order), while this caller waits for the earlier one: both would wait until a wait
      -- ran out. So two waiters never wait for each other on keys that are free: one stands in a
      -- later line only once nobody ahead of it keeps it out of the earlier ones. A place it still
      -- has is kept (nobody who came later passes it); a line it joins has it at the back.
      -- One key, the usual case, by equality: the same count over an array slice would be planned
      -- anew on every call (PostgreSQL finds no generic plan it trusts for it), which cost more
      -- than the rest of the call, with the key locked.
      IF blocked = 1 THEN
        SELECT count(*) INTO kept_place FROM ${n.waiters} w WHERE w.key = p_keys[1] AND w.owner = p_owner AND w.deadline > now_ts;
      ELSE
        SELECT count(*) INTO kept_place
          FROM ${n.waiters} w WHERE w.key = ANY (p_keys[1:blocked]) AND w.owner = p_owner AND w.deadline > now_ts;
      END IF;
      kept_place := CASE WHEN kept_place < blocked THEN nextval('${n.places}') ELSE 0 END;
      -- A waiter for one key is handed the lock on release, with its ttl but no longer than its
      -- place lasts, so one that died in line holds the others up that long at most.
      INSERT INTO ${n.waiters} AS w (key, owner, place, channel, deadline, lease_ms, max_holders, holder, since)
        SELECT u.key, p_owner, kept_place, p_channel, now_ts + p_waiter_timeout_ms * interval '1 millisecond',
               CASE WHEN cardinality(p_keys) = 1 THEN least(p_ttl_ms, p_waiter_timeout_ms) ELSE 0 END, coalesce(u.lim, 1),
               p_holder, now_ts
          FROM unnest(p_keys[1:blocked], p_limits[1:blocked]) AS u(key, lim)
        ON CONFLICT (key, owner) DO UPDATE
          SET place = CASE WHEN w.deadline > now_ts THEN w.place ELSE excluded.place END, channel = excluded.channel,
              deadline = excluded.deadline, lease_ms = excluded.lease_ms, max_holders = excluded.max_holders, holder = excluded.holder,
              since = CASE WHEN w.deadline > now_ts THEN coalesce(w.since, excluded.since) ELSE excluded.since END;
      -- A place an earlier attempt took in a later line, while the keys before it let it in: it
      -- goes, and whoever it kept out there may enter now.
      FOR i IN blocked + 1 .. cardinality(p_keys) LOOP
        DELETE FROM ${n.waiters} w WHERE w.key = p_keys[i] AND w.owner = p_owner;
        IF FOUND THEN
          PERFORM ${n.admit}(p_keys[i], now_ts);
        END IF;
      END LOOP;
    END IF;
    RETURN;
  END IF;

  token := nextval('${n.tokens}');
  INSERT INTO ${n.locks} AS l (key, owner, fencing_token, expires_at, max_holders, holder, acquired_at)
    SELECT u.key, p_owner, token, now_ts + p_ttl_ms * interval '1 millisecond', coalesce(u.lim, 1), p_holder, now_ts
      FROM unnest(p_keys, p_limits) AS u(key, lim)
    ON CONFLICT (key, owner) DO UPDATE
      SET fencing_token = excluded.fencing_token, expires_at = excluded.expires_at, max_holders = excluded.max_holders,
          holder = excluded.holder, acquired_at = excluded.acquired_at;
  -- Every line of these keys was read above but those of keys it held already: when all were
  -- empty, it had no place to leave.
  IF in_line OR cardinality(mine) > 0 THEN
    DELETE FROM ${n.waiters} w WHERE w.key = ANY (p_keys) AND w.owner = p_owner;
    GET DIAGNOSTICS left_line = ROW_COUNT;
  END IF;
  -- It stood at the head of lines where others may enter beside it: those behind it that can.
  IF left_line > 0 AND p_limits IS NOT NULL THEN
    FOR i IN 1 .. cardinality(p_keys) LOOP
      CONTINUE WHEN coalesce(p_limits[i], 1) = 1;
      PERFORM ${n.admit}(p_keys[i], now_ts);
    END LOOP;
  END IF;
  acquired := true;
END
$fn$;

-- The signatures of earlier releases, for their processes still running on these tables: without
-- who asks (stored as unknown), and before shared holders (an exclusive caller of the same line).
CREATE OR REPLACE FUNCTION ${n.acquire}(
  p_keys text[], p_owner text, p_ttl_ms integer, p_waiter_timeout_ms integer, p_will_wait boolean, p_channel text,
  p_limits double precision[],
  OUT acquired boolean, OUT token bigint, OUT retry_after_ms bigint, OUT mismatch_key text, OUT mismatch_limit double precision
) LANGUAGE sql AS $fn$
  SELECT a.acquired, a.token, a.retry_after_ms, a.mismatch_key, a.mismatch_limit
    FROM ${n.acquire}(p_keys, p_owner, p_ttl_ms, p_waiter_timeout_ms, p_will_wait, p_channel, p_limits, NULL::text) a
$fn$;
CREATE OR REPLACE FUNCTION ${n.acquire}(
  p_keys text[], p_owner text, p_ttl_ms integer, p_waiter_timeout_ms integer, p_will_wait boolean, p_channel text,
  OUT acquired boolean, OUT token bigint, OUT retry_after_ms bigint
) LANGUAGE sql AS $fn$
  SELECT a.acquired, a.token, a.retry_after_ms
    FROM ${n.acquire}(p_keys, p_owner, p_ttl_ms, p_waiter_timeout_ms, p_will_wait, p_channel, NULL::double precision[], NULL::text) a
$fn$;

-- Resets the lease of every key if the owner still holds all of them; else changes nothing.
CREATE OR REPLACE FUNCTION ${n.extend}(p_keys text[], p_owner text, p_ttl_ms integer) RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
  now_ts timestamptz;
BEGIN
  ${lockKeys}
  now_ts := clock_timestamp();
  IF (SELECT count(*) FROM ${n.locks} l WHERE l.key = ANY (p_keys) AND l.owner = p_owner AND l.expires_at > now_ts)
     < cardinality(p_keys) THEN
    RETURN false;
  END IF;
  UPDATE ${n.locks} l SET expires_at = now_ts + p_ttl_ms * interval '1 millisecond' WHERE l.key = ANY (p_keys) AND l.owner = p_owner;
  RETURN true;
END
$fn$;

-- Lets in, from the head of the key's line, every waiter that can enter now, and stops at the
-- first that cannot: nobody passes it. A waiter for one key is handed the key here, with a
-- fencing token taken now, and told '<owner> <token> <lease ms>': it enters without another round
-- trip. A waiter for several keys (lease_ms 0) is told '<owner>' and asks again; so is one whose
-- limit disagrees with the holders' (its attempt reports the mismatch). Called with the key
-- locked, by the caller's transaction.
CREATE OR REPLACE FUNCTION ${n.admit}(p_key text, p_now timestamptz) RETURNS void LANGUAGE plpgsql SET enable_bitmapscan = off SET enable_seqscan = off AS $fn$
DECLARE
  holders bigint;
  least_limit double precision;
  shared_limit double precision;
  w record;
  handed bigint;
BEGIN
  DELETE FROM ${n.waiters} x WHERE x.key = p_key AND x.deadline <= p_now;
  FOR w IN SELECT x.owner, x.channel, x.lease_ms, x.max_holders, x.holder FROM ${n.waiters} x WHERE x.key = p_key ORDER BY x.place LOOP
    -- Read once someone waits: most releases find an empty line.
    IF holders IS NULL THEN
      SELECT count(*), min(l.max_holders), max(l.max_holders) FILTER (WHERE l.max_holders > 1)
        INTO holders, least_limit, shared_limit
        FROM ${n.locks} l WHERE l.key = p_key AND l.expires_at > p_now;
    END IF;
    IF w.max_holders > 1 AND shared_limit <> w.max_holders THEN
      PERFORM pg_notify(w.channel, w.owner);
      EXIT;
    END IF;
    EXIT WHEN holders >= least(w.max_holders, least_limit);
    handed := NULL;
    IF w.lease_ms > 0 THEN
      -- Without a token left, the key stays free: the waiter is only told, and its own acquire
      -- then fails with the error that names the fix.
      BEGIN
        handed := nextval('${n.tokens}');
      EXCEPTION WHEN sequence_generator_limit_exceeded THEN
        handed := NULL;
      END;
    END IF;
    IF handed IS NULL THEN
      -- Sent when this transaction commits; the same message twice in it is sent once.
      PERFORM pg_notify(w.channel, w.owner);
      EXIT;
    END IF;
    INSERT INTO ${n.locks} AS l (key, owner, fencing_token, expires_at, max_holders, holder, acquired_at)
      VALUES (p_key, w.owner, handed, p_now + w.lease_ms * interval '1 millisecond', w.max_holders, w.holder, p_now)
      ON CONFLICT (key, owner) DO UPDATE
        SET fencing_token = excluded.fencing_token, expires_at = excluded.expires_at, max_holders = excluded.max_holders,
            holder = excluded.holder, acquired_at = excluded.acquired_at;
    DELETE FROM ${n.waiters} x WHERE x.key = p_key AND x.owner = w.owner;
    -- Sent when this transaction commits.
    PERFORM pg_notify(w.channel, w.owner || ' ' || handed || ' ' || w.lease_ms);
    holders := holders + 1;
    least_limit := least(least_limit, w.max_holders);
    IF w.max_holders > 1 THEN
      shared_limit := w.max_holders;
    END IF;
  END LOOP;
END
$fn$;

-- Compare-and-delete: frees the keys the owner still holds (a late release never frees another
-- owner's lease) and takes the owner out of their lines (a waiter that gives up). Then lets in
-- whoever can enter now (see _admit). Returns how many unexpired leases the owner held.
CREATE OR REPLACE FUNCTION ${n.release}(p_keys text[], p_owner text) RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
  now_ts timestamptz;
  k text;
  expired_at timestamptz;
  held boolean;
  waited boolean;
  released integer := 0;
BEGIN
  ${lockKeys}
  now_ts := clock_timestamp();
  FOREACH k IN ARRAY p_keys LOOP
    DELETE FROM ${n.locks} l WHERE l.key = k AND l.owner = p_owner RETURNING l.expires_at INTO expired_at;
    held := FOUND;
    IF held AND expired_at > now_ts THEN
      released := released + 1;
    END IF;
    -- Most lines are empty: nobody to take out, nobody to let in.
    PERFORM FROM ${n.waiters} w WHERE w.key = k LIMIT 1;
    CONTINUE WHEN NOT FOUND;
    DELETE FROM ${n.waiters} w WHERE w.key = k AND w.owner = p_owner;
    waited := FOUND;
    IF held OR waited THEN
      PERFORM ${n.admit}(k, now_ts);
    END IF;
  END LOOP;
  RETURN released;
END
$fn$;
`;
}

/**
 * The key locks of a call (see above). A call of one key, under READ COMMITTED, takes the same
 * lock as `_lock_keys` (the same hash) inline: the nested call and its sort cost more than the
 * lock. Any other call, or any other isolation level (which `_lock_keys` refuses), goes there.
 */
function lockKeysSql(n: PostgresLockNames): string {
  return `IF cardinality(p_keys) = 1 AND current_setting('transaction_isolation') = 'read committed' THEN
    PERFORM pg_advisory_xact_lock(hashtextextended('${n.qualified}:' || p_keys[1], 0));
  ELSE
    PERFORM ${n.lockKeys}(p_keys);
  END IF;`;
}
