import { afterAll, afterEach, beforeAll } from '@jest/globals';
import pg from 'pg';
import { PostgresServer, type PostgresServerOptions } from './postgres-server.js';

/** What a test file gets from usePostgresServer(). */
export interface PostgresFixture {
  /** The file's own PostgreSQL, started once for the file. */
  readonly server: PostgresServer;
  /** A database of the file's own on that server. */
  readonly url: string;
  /** A pool on that database (opened on first use), for looking at tables and setting up faults. */
  readonly admin: pg.Pool;
  /**
   * Runs `step` after the current test; steps run last-first, and a failing one fails the test
   * without stopping the others.
   */
  cleanup(step: () => unknown): void;
}

/**
 * One PostgreSQL for the calling test file (started in beforeAll, stopped in afterAll), with a
 * database of its own. After each test the cleanup steps run, then the lock tables are emptied
 * (`truncate: false` keeps them).
 */
export function usePostgresServer(options: PostgresServerOptions & { truncate?: boolean } = {}): PostgresFixture {
  let server: PostgresServer | undefined;
  let url: string | undefined;
  let admin: pg.Pool | undefined;
  const steps: (() => unknown)[] = [];

  beforeAll(async () => {
    server = await PostgresServer.start(options);
    url = await server.createDatabase('locks');
  }, 60_000);
  afterEach(async () => {
    let failure: { error: unknown } | undefined;
    while (steps.length > 0) {
      try {
        await steps.pop()!();
      } catch (error) {
        failure ??= { error };
      }
    }
    if (options.truncate !== false) await emptyLockTables(fixture.admin);
    if (failure) throw failure.error;
  });
  afterAll(async () => {
    await admin?.end();
    await server?.stop();
  });

  const fixture: PostgresFixture = {
    get server() {
      if (!server) throw new Error('usePostgresServer(): the server starts in beforeAll; use it inside a test or hook');
      return server;
    },
    get url() {
      if (!url) throw new Error('usePostgresServer(): the database is created in beforeAll; use it inside a test or hook');
      return url;
    },
    get admin() {
      // Connections of a server that restarted are dropped from the pool, not reported.
      admin ??= new pg.Pool({ connectionString: fixture.url, max: 4 }).on('error', () => undefined);
      return admin;
    },
    cleanup(step) {
      steps.push(step);
    },
  };
  return fixture;
}

/** Empties every lock table of the database (the default one and any a test named itself). */
async function emptyLockTables(admin: pg.Pool): Promise<void> {
  const { rows } = await admin.query<{ name: string }>(
    `SELECT format('%I.%I', n.nspname, c.relname) AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relkind = 'r' AND obj_description(c.oid, 'pg_class') LIKE 'nest-distributed-lock%'`,
  );
  for (const { name } of rows) await admin.query(`TRUNCATE ${name}, ${name}_waiters`);
}
