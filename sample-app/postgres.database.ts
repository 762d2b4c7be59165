import { Logger, type OnApplicationShutdown } from '@nestjs/common';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { setImmediate } from 'node:timers/promises';
import { runMigrations } from './database.migrations.js';
import type { Database, QueryResult, Queryable } from './database.provider.js';

/**
 * Embedded PostgreSQL (WASM) in this process's memory, one connection that queues queries.
 *
 * It runs in this thread and can answer within the same turn of the event loop, which no
 * networked database does: a request could then read and write before any other request got a
 * turn, and the shop would behave as if requests never overlapped. Each result is handed over
 * on the next turn instead, so concurrent requests interleave between their queries the way
 * they do against PostgreSQL over a socket.
 */
class PgliteDatabase implements Database, OnApplicationShutdown {
  readonly kind = 'pglite';
  constructor(private readonly db: PGlite) {}

  async query<Row>(sql: string, params?: unknown[]): Promise<QueryResult<Row>> {
    const { rows, affectedRows } = await this.db.query<Row>(sql, params);
    await setImmediate();
    return { rows, affectedRows: affectedRows ?? 0 };
  }
  async exec(sql: string): Promise<void> {
    await this.db.exec(sql);
  }
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T> {
    return this.db.transaction((tx) =>
      fn({
        query: async <Row>(sql: string, params?: unknown[]) => {
          const { rows, affectedRows } = await tx.query<Row>(sql, params);
          return { rows, affectedRows: affectedRows ?? 0 };
        },
        exec: async (sql: string) => void (await tx.exec(sql)),
      }),
    );
  }
  async close(): Promise<void> {
    if (!this.db.closed) await this.db.close();
  }
  onApplicationShutdown(): Promise<void> {
    return this.close();
  }
}

/** PostgreSQL over the network, through a `pg` pool. */
class PostgresDatabase implements Database, OnApplicationShutdown {
  readonly kind = 'postgres';
  private closed = false;
  constructor(private readonly pool: pg.Pool) {}

  async query<Row>(sql: string, params?: unknown[]): Promise<QueryResult<Row>> {
    const { rows, rowCount } = await this.pool.query(sql, params);
    return { rows: rows as Row[], affectedRows: rowCount ?? 0 };
  }
  async exec(sql: string): Promise<void> {
    await this.pool.query(sql);
  }
  async transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN');
      const result = await fn({
        query: async <Row>(sql: string, params?: unknown[]) => {
          const { rows, rowCount } = await client.query(sql, params);
          return { rows: rows as Row[], affectedRows: rowCount ?? 0 };
        },
        exec: async (sql: string) => void (await client.query(sql)),
      });
      await client.query('COMMIT');
      return result;
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
  }
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.pool.end();
  }
  onApplicationShutdown(): Promise<void> {
    return this.close();
  }
}

/** PostgreSQL at `url`, or the embedded PGlite without one; migrated before it is handed out. */
export async function openPostgresDatabase(url: string | undefined): Promise<Database> {
  let database: Database;
  if (url) {
    const pool = new pg.Pool({ connectionString: url, max: 10 });
    // An idle client's connection error would otherwise be an unhandled 'error' event.
    pool.on('error', (error) => new Logger('Database').warn(`Idle PostgreSQL connection failed: ${error.message}`));
    database = new PostgresDatabase(pool);
  } else {
    database = new PgliteDatabase(await PGlite.create());
  }
  try {
    await runMigrations(database);
  } catch (error) {
    await database.close();
    throw error;
  }
  return database;
}
