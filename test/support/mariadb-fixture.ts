import { afterAll, afterEach, beforeAll } from '@jest/globals';
import mysql from 'mysql2/promise';
import { MariadbServer } from './mariadb-server.js';

/** What a test file gets from useMariadbServer(). */
export interface MariadbFixture {
  /** The file's own MariaDB, started once for the file. */
  readonly server: MariadbServer;
  /** A database of the file's own on that server, as the test user (not an administrator). */
  readonly url: string;
  readonly database: string;
  /** An administrator's pool on that database (opened on first use), for looking at tables and setting up faults. */
  readonly admin: mysql.Pool;
  /** Runs `step` after the current test; steps run last-first, and a failing one fails the test without stopping the others. */
  cleanup(step: () => unknown): void;
}

/**
 * One MariaDB for the calling test file (started in beforeAll, stopped in afterAll), with a
 * database of its own. After each test the cleanup steps run, then the lock tables are emptied
 * (`truncate: false` keeps them).
 */
export function useMariadbServer(options: { truncate?: boolean; args?: readonly string[] } = {}): MariadbFixture {
  let server: MariadbServer | undefined;
  let created: { name: string; url: string } | undefined;
  let admin: mysql.Pool | undefined;
  const steps: (() => unknown)[] = [];

  beforeAll(async () => {
    server = await MariadbServer.start({ args: options.args });
    created = await server.createDatabase('locks');
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

  const fixture: MariadbFixture = {
    get server() {
      if (!server) throw new Error('useMariadbServer(): the server starts in beforeAll; use it inside a test or hook');
      return server;
    },
    get url() {
      if (!created) throw new Error('useMariadbServer(): the database is created in beforeAll; use it inside a test or hook');
      return created.url;
    },
    get database() {
      if (!created) throw new Error('useMariadbServer(): the database is created in beforeAll; use it inside a test or hook');
      return created.name;
    },
    get admin() {
      admin ??= mysql.createPool({ uri: fixture.server.adminUrl(fixture.database), connectionLimit: 4 });
      return admin;
    },
    cleanup(step) {
      steps.push(step);
    },
  };
  return fixture;
}

/**
 * Empties every lock table of the database (the default one and any a test named itself): the
 * tables whose comment is ours (key tables and holders tables), and the lines beside them.
 */
export async function emptyLockTables(admin: mysql.Pool): Promise<void> {
  const [rows] = await admin.query<mysql.RowDataPacket[]>(
    `SELECT TABLE_NAME AS name, TABLE_COMMENT AS comment FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()`,
  );
  const names = new Set(rows.map((row) => row.name as string));
  for (const { name, comment } of rows) {
    if (!String(comment).startsWith('nest-distributed-lock')) continue;
    await admin.query(`DELETE FROM \`${name}\``);
    if (names.has(`${name}_waiters`)) await admin.query(`DELETE FROM \`${name}_waiters\``);
  }
}
