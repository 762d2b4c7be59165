import type { Pool } from 'pg';
import type { PostgresLockNames } from './postgres.schema.js';
import { MAX_FENCING_TOKEN } from './postgres.schema.js';

/** Who the backend connects as, for fixes that name them. */
export interface ConnectionIdentity {
  /** The role, when the settings name it (PostgreSQL's default otherwise: the OS user). */
  role: string | undefined;
  database: string | undefined;
}

/**
 * For an error that waiting cannot heal, what is wrong and how to fix it, in words; undefined for
 * an error that may pass (a server down, a timeout, a lock another transaction holds, a server in
 * recovery during a failover). PostgreSQL says which by its SQLSTATE code.
 */
export function permanentCause(
  error: unknown,
  names: PostgresLockNames,
  who: ConnectionIdentity,
  /** For a read-only error (25006): pg_is_in_recovery() of the server, undefined if unknown. */
  inRecovery?: boolean,
): string | undefined {
  const code = (error as { code?: unknown } | undefined)?.code;
  const role = who.role === undefined ? '<role>' : quoteIdent(who.role);
  switch (code) {
    // invalid_password; invalid_authorization_specification (no such role, or pg_hba.conf refuses it)
    case '28P01':
    case '28000':
      return (
        `PostgreSQL refused the credentials of role ${who.role ?? '(the default)'}: correct the user and password of the ` +
        `connection (or the server's pg_hba.conf), as waiting will not change its answer.`
      );
    // invalid_catalog_name
    case '3D000':
      return (
        `The database ${who.database ?? '(the default)'} does not exist on this server: correct the database name of the ` +
        `connection, or create it (CREATE DATABASE ${who.database === undefined ? '<name>' : quoteIdent(who.database)}).`
      );
    // read_only_sql_transaction: a server in recovery (a hot standby, or a replica a failover is
    // promoting: may pass), or default_transaction_read_only on for the role or the database
    // (waiting will not change it). Which, the caller asked the server (inRecovery).
    case '25006':
      if (inRecovery !== false) return undefined;
      return (
        `The session is read-only on a server that is not in recovery: the role or the database has ` +
        `default_transaction_read_only on. ALTER ROLE ${role} SET default_transaction_read_only = off ` +
        `(or the same on the database), or use a role that may write.`
      );
    // insufficient_privilege
    case '42501':
      return (
        `Role ${role} may not use the lock tables: GRANT USAGE ON SCHEMA ${quoteIdent(names.schema)} TO ${role}; ` +
        `GRANT SELECT, INSERT, UPDATE, DELETE ON ${names.locks}, ${names.waiters} TO ${role}; ` +
        `GRANT USAGE, SELECT ON SEQUENCE ${names.tokens}, ${names.places} TO ${role}.`
      );
    // sequence_generator_limit_exceeded: only the token sequence has a limit that can be reached
    case '2200H':
      return (
        `The fencing-token sequence ${names.tokens} reached its maximum, ${MAX_FENCING_TOKEN}, the greatest integer a ` +
        `JavaScript number holds exactly: no token greater than the last can be handed out, so no lock can be taken. A ` +
        `sequence only gets there when it was moved (setval, ALTER SEQUENCE ... RESTART). Moving it back would hand out ` +
        `tokens again that your stores have seen: give the backend a new table (option 'table'), whose tokens start at 1, ` +
        `and reset the fencing tokens your stores keep.`
      );
    // invalid_parameter_value, from the ALTER SEQUENCE ... MAXVALUE that brings the lock tables of
    // an older version up to date, on a token sequence already past it: it stays so.
    case '22023':
      if (!/MAXVALUE/.test((error as { message?: unknown }).message as string)) return undefined;
      return (
        `The fencing-token sequence ${names.tokens} is already past ${MAX_FENCING_TOKEN}, the greatest integer a JavaScript ` +
        `number holds exactly, so it cannot be given that maximum: its tokens no longer reach the application exactly. ` +
        `Moving it back would hand out tokens again that your stores have seen: give the backend a new table (option ` +
        `'table'), whose tokens start at 1, and reset the fencing tokens your stores keep.`
      );
    default:
      return undefined;
  }
}

/** A name as SQL takes it: quoted unless it is a plain lower-case name. */
export function quoteIdent(name: string): string {
  return /^[a-z_][a-z0-9_$]*$/.test(name) ? name : `"${name.replaceAll('"', '""')}"`;
}

/** The SQLSTATE of a write refused by a read-only server or session. */
export const READ_ONLY_SQL_TRANSACTION = '25006';

/** What a read-only error says when the server is in recovery: it may pass (a failover). */
export const IN_RECOVERY_NOTE =
  'PostgreSQL is in recovery (a hot standby, or a replica during a failover): locks are retried within the wait. If this ' +
  'is not a failover, connect to the primary.';

/**
 * What to run when the role may not create the lock tables: create the schema for it when it does
 * not exist (granting CREATE on a schema that does not exist cannot be done), else grant CREATE on
 * it; or create the tables in a migration. `client` is the connection that was refused.
 */
export async function createTablesFix(
  client: { query: Pool['query'] },
  { schema, table }: { schema: string; table: string },
  who: ConnectionIdentity,
): Promise<string> {
  const migration =
    `or create the tables in a migration, as a role that may (the SQL of postgresLockTablesSql({ schema: '${schema}', ` +
    `table: '${table}' })), and pass createTables: false.`;
  const found = await client
    .query<{ role: string; exists: boolean }>('SELECT current_user AS role, to_regnamespace($1) IS NOT NULL AS exists', [
      quoteIdent(schema),
    ])
    .then(({ rows }) => rows[0])
    .catch(() => undefined);
  const role = quoteIdent(found?.role ?? who.role ?? '<role>');
  if (found?.exists === false) {
    return (
      `Schema ${schema} does not exist and role ${role} may not create it. Run, as a role that may (the database's ` +
      `owner): CREATE SCHEMA ${quoteIdent(schema)} AUTHORIZATION ${role}; ${migration}`
    );
  }
  return `Run, as the schema's owner: GRANT CREATE ON SCHEMA ${quoteIdent(schema)} TO ${role}; ${migration}`;
}
