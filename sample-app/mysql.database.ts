import type { OnApplicationShutdown } from '@nestjs/common';
import mysql from 'mysql2/promise';
import type { Database, QueryResult, Queryable } from './database.provider.js';
import { runMysqlMigrations } from './mysql-database.migrations.js';

/**
 * MySQL or MariaDB through a `mysql2` pool. Its SQL is MySQL's (`?` placeholders): the MySQL
 * repositories write it. A write answers with the rows it matched (mysql2 asks the server for
 * found rows, not changed rows) and the id an INSERT generated.
 */
class MysqlDatabase implements Database, OnApplicationShutdown {
  readonly kind = 'mysql';
  private closed = false;
  constructor(private readonly pool: mysql.Pool) {}

  async query<Row>(sql: string, params?: unknown[]): Promise<QueryResult<Row>> {
    return toResult<Row>((await this.pool.query(sql, params))[0]);
  }
  /** One statement: the pool does not take several in one string (no multipleStatements, no SQL smuggled after a `;`). */
  async exec(sql: string): Promise<void> {
    await this.pool.query(sql);
  }
  async transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T> {
    const connection = await this.pool.getConnection();
    try {
      await connection.beginTransaction();
      const result = await fn({
        query: async <Row>(sql: string, params?: unknown[]) => toResult<Row>((await connection.query(sql, params))[0]),
        exec: async (sql: string) => void (await connection.query(sql)),
      });
      await connection.commit();
      return result;
    } catch (error) {
      await connection.rollback().catch(() => undefined);
      throw error;
    } finally {
      connection.release();
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

function toResult<Row>(result: unknown): QueryResult<Row> {
  // A SELECT (the shop's writes use no RETURNING, which MySQL lacks and MariaDB has on INSERT and DELETE only).
  if (Array.isArray(result)) return { rows: result as Row[], affectedRows: result.length };
  const header = result as mysql.ResultSetHeader;
  return { rows: [], affectedRows: header.affectedRows, insertId: header.insertId };
}

/** MySQL or MariaDB at a `mysql://` or `mariadb://` URL, migrated before it is handed out. */
export async function openMysqlDatabase(url: string): Promise<Database> {
  // mysql2 reads mysql:// URLs only; a mariadb:// one speaks the same protocol.
  const pool = mysql.createPool({ uri: url.trim().replace(/^mariadb:/i, 'mysql:'), connectionLimit: 10 });
  try {
    await runMysqlMigrations(pool);
  } catch (error) {
    await pool.end();
    throw error;
  }
  return new MysqlDatabase(pool);
}
